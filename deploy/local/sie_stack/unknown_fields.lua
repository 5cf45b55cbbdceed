-- Refuse an HTTP/JSON body that holds a field its message does not define.
--
-- Envoy's gRPC-JSON transcoder drops such a field and the call goes on, so a
-- caller's parameter would be silently ignored. This filter runs before the
-- transcoder: it walks the body's JSON and answers 400 naming the first
-- unknown field (`params.colour`, `items[2].txt`). What the body's message
-- holds comes from the contract's descriptor set (sie_stack.unknown_fields
-- prepends ROUTES and MESSAGES to this file). Free-form values (Struct,
-- Value: `options`, `input`) and map keys are not checked. A body that is not
-- well-formed JSON is left to the transcoder, which refuses it.
--
-- MESSAGES[name] = {fields = {[json name] = false (scalar or free-form), a
--                   message name, or {map = false | a message name}},
--                   known = its fields' proto names, space-separated}
-- ROUTES = {{method, Lua pattern of the path, message name of the body}, ...}

local MAX_DEPTH = 64

local function skip_space(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

-- The string starting at s[i] == '"': the index after it, and its text (simple escapes decoded).
local function read_string(s, i)
  local j = i + 1
  local escaped = false
  while true do
    local k = s:find('["\\]', j)
    if not k then
      return nil
    end
    if s:byte(k) == 34 then -- '"'
      local text = s:sub(i + 1, k - 1)
      if escaped then
        text = text:gsub("\\u00(%x%x)", function(hex) return string.char(tonumber(hex, 16)) end)
        text = text:gsub("\\(.)", "%1")
      end
      return k + 1, text
    end
    escaped = true
    j = k + 2
  end
end

local walk

-- An object at s[i]; `schema` nil means any keys. Returns the index after it,
-- or nil and (for an unknown field) its path.
local function walk_object(s, i, schema, where, depth)
  i = skip_space(s, i + 1)
  if s:byte(i) == 125 then -- '}'
    return i + 1
  end
  while true do
    if s:byte(i) ~= 34 then
      return nil
    end
    local key
    i, key = read_string(s, i)
    if not i then
      return nil
    end
    local path = where == "" and key or (where .. "." .. key)
    local child = nil
    if schema ~= nil then
      if schema.fields == nil then
        child = schema.map
      else
        child = schema.fields[key]
        if child == nil then
          return nil, path, schema.known
        end
      end
    end
    i = skip_space(s, i)
    if s:byte(i) ~= 58 then -- ':'
      return nil
    end
    local unknown, known
    i, unknown, known = walk(s, i + 1, child, path, depth + 1)
    if not i then
      return nil, unknown, known
    end
    i = skip_space(s, i)
    local c = s:byte(i)
    if c == 44 then -- ','
      i = skip_space(s, i + 1)
    elseif c == 125 then
      return i + 1
    else
      return nil
    end
  end
end

local function walk_array(s, i, schema, where, depth)
  i = skip_space(s, i + 1)
  if s:byte(i) == 93 then -- ']'
    return i + 1
  end
  local index = 0
  while true do
    local unknown, known
    i, unknown, known = walk(s, i, schema, where .. "[" .. index .. "]", depth + 1)
    if not i then
      return nil, unknown, known
    end
    i = skip_space(s, i)
    local c = s:byte(i)
    if c == 44 then
      i = i + 1
      index = index + 1
    elseif c == 93 then
      return i + 1
    else
      return nil
    end
  end
end

-- The value at s[i] (after spaces); `schema` is false/nil (anything), a message name, or a map.
walk = function(s, i, schema, where, depth)
  if depth > MAX_DEPTH then
    return nil
  end
  if type(schema) == "string" then
    schema = MESSAGES[schema]
  elseif schema == false then
    schema = nil
  end
  i = skip_space(s, i)
  local c = s:byte(i)
  if c == 123 then -- '{'
    return walk_object(s, i, schema, where, depth)
  elseif c == 91 then -- '['
    return walk_array(s, i, schema, where, depth)
  elseif c == 34 then
    return read_string(s, i)
  end
  local j = s:find("[,}%] \t\r\n]", i) or #s + 1
  if j == i then
    return nil
  end
  return j
end

-- `text` as a JSON string (control characters, quotes and backslashes escaped).
local function json_string(text)
  return '"' .. (text:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end)) .. '"'
end

-- The JSON error body the transcoder gives gRPC errors: INVALID_ARGUMENT, ErrorInfo UNKNOWN_FIELD.
-- `known`: the fields the message at that place has, space-separated.
local function refusal(path, known)
  if #path > 200 then
    path = path:sub(1, 200) .. "..."
  end
  local message = "unknown field '" .. path .. "': the request has no such field; there it takes "
    .. (known:gsub(" ", ", ")) .. " (docs/http.md lists the body shapes)"
  return '{"code": 3, "message": ' .. json_string(message)
    .. ', "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "UNKNOWN_FIELD", "domain": "sie", "metadata": {"field": '
    .. json_string(path) .. '}}]}'
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local content_type = headers:get("content-type") or ""
  if content_type:find("^application/grpc") then
    return
  end
  local method = headers:get(":method")
  local path = (headers:get(":path") or ""):gsub("%?.*$", "")
  local message = nil
  for _, route in ipairs(ROUTES) do
    if route[1] == method and path:find(route[2]) then
      message = route[3]
      break
    end
  end
  if message == nil then
    return
  end
  local body = handle:body()
  if body == nil or body:length() == 0 then
    return
  end
  local text = body:getBytes(0, body:length())
  local start = skip_space(text, 1)
  if text:byte(start) ~= 123 then
    return
  end
  local ended, unknown, known = walk(text, start, message, "", 0)
  if ended == nil and unknown ~= nil then
    handle:respond({[":status"] = "400", ["content-type"] = "application/json"}, refusal(unknown, known))
  end
end
