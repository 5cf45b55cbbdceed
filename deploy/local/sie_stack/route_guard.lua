-- The route guard: runs after Envoy's gRPC-JSON transcoder and lets a request through to a gRPC route
-- only when request_check.lua checked it for that very RPC (or saw it arrive as native gRPC).
--
-- The check matches a path against the contract's routes and the transcoder matches it against the
-- same google.api.http rules, each in its own way; where they ever differ (a path spelling one reads as
-- a route and the other does not, a default binding of the transcoder's), the request is refused here
-- with 404 ROUTE_NOT_FOUND instead of reaching a service unchecked.
--
-- A JSON body the check reads chunk by chunk (`checking`) reaches the transcoder, and so this guard, only
-- once the check has all of it, whole (or not at all: the check drains each chunk); its headers come
-- first. So the guard waits for the transcoded body, then lets it through if the check passed it (`rpc`),
-- gives the check's refusal (`refusal`, `refusal_status`) if it refused it, and 500 if the check never
-- said (a fault of the check: nothing unchecked goes on).
--
-- sie_stack.request_check prepends NAMESPACE, the dynamic-metadata namespace the check writes to,
-- NOT_FOUND, the JSON body of Envoy's other 404s, and CHECK_FAILED, the 500's.

local function is_grpc(content_type) -- as request_check.lua's
  return content_type == "application/grpc" or string.find(content_type, "^application/grpc%+") ~= nil
end

-- The answer for a transcoded request: nil to let it through, else status and body.
local function verdict(checked, path)
  if checked ~= nil and checked.refusal ~= nil then
    return checked.refusal_status or "400", checked.refusal
  end
  if checked ~= nil and checked.rpc == path then
    return nil
  end
  if checked ~= nil and checked.checking and checked.rpc == nil then
    return "500", CHECK_FAILED
  end
  return "404", NOT_FOUND
end

function envoy_on_request(handle)
  local headers = handle:headers()
  if not is_grpc(headers:get("content-type") or "") then
    return -- not for a service: Envoy's own routes answer it
  end
  local checked = handle:streamInfo():dynamicMetadata():get(NAMESPACE)
  if checked ~= nil and checked.checking and checked.rpc == nil and checked.refusal == nil then
    handle:body() -- the transcoded body: the check has read, and passed or refused, the JSON one by then
    headers = handle:headers() -- (wrappers do not outlive a yield)
    checked = handle:streamInfo():dynamicMetadata():get(NAMESPACE)
  end
  -- A fault here must not let the request through (Envoy goes on past a failed script): it answers 500.
  local ok, status, body = pcall(verdict, checked, headers:get(":path"))
  if ok and status == nil then
    if checked.checking then
      headers:remove("content-length") -- the check's hand-over set the JSON body's; the transcoder sends its own body
    end
    return
  end
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "answered", true)
  handle:respond({[":status"] = ok and status or "500", ["content-type"] = "application/json"},
    ok and body or CHECK_FAILED)
end
