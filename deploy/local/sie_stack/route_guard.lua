-- The route guard: runs after Envoy's gRPC-JSON transcoder and lets a request through to a gRPC route
-- only when request_check.lua checked it for that very RPC (or saw it arrive as native gRPC).
--
-- The check matches a path against the contract's routes and the transcoder matches it against the
-- same google.api.http rules, each in its own way; where they ever differ (a path spelling one reads as
-- a route and the other does not, a default binding of the transcoder's), the request is refused here
-- with 404 ROUTE_NOT_FOUND instead of reaching a service unchecked.
--
-- sie_stack.request_check prepends NAMESPACE, the dynamic-metadata namespace the check writes `rpc` to,
-- and NOT_FOUND, the JSON body of Envoy's other 404s.

local function is_grpc(content_type) -- as request_check.lua's
  return content_type == "application/grpc" or string.find(content_type, "^application/grpc%+") ~= nil
end

function envoy_on_request(handle)
  local headers = handle:headers()
  if not is_grpc(headers:get("content-type") or "") then
    return -- not for a service: Envoy's own routes answer it
  end
  local checked = handle:streamInfo():dynamicMetadata():get(NAMESPACE)
  if checked ~= nil and checked.rpc == headers:get(":path") then
    return
  end
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "answered", true)
  handle:respond({[":status"] = "404", ["content-type"] = "application/json"}, NOT_FOUND)
end
