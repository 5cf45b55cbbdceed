-- Refuse an HTTP/JSON body that holds a field its message does not define.
--
-- Envoy's gRPC-JSON transcoder drops such a field and the call goes on, so a
-- caller's parameter would be silently ignored. This filter runs before the
-- transcoder: it walks the body's JSON and answers 400 naming the first
-- unknown field (`params.colour`, `items[2].txt`). What the body's message
-- holds comes from the contract's descriptor set (sie_stack.unknown_fields
-- prepends ROUTES and MESSAGES to this file). Free-form values (Struct,
-- Value: `options`, `input`) and map keys are not checked.
--
-- A body this walk cannot read as strict JSON (RFC 8259) is refused too
-- (400 INVALID_JSON): the transcoder's parser also takes trailing commas,
-- single quotes, unquoted keys and more whitespace, so a field written that
-- way would otherwise pass unseen and be dropped. The walk is linear in the
-- body: a field's path is only spelled out for the refusal.
--
-- MESSAGES[name] = {fields = {[json name] = false (scalar or free-form), a
--                   message name, or {map = false | a message name}},
--                   known = its fields' proto names, space-separated,
--                   proto = {[JSON name] = proto name} where they differ (a
--                   field given twice, under either name, is refused: the
--                   transcoder keeps one value without a word),
--                   in_path = the keys the route's path binds (a body's root only:
--                   the transcoder would let the body override the path)}
-- ROUTES = {{method, Lua pattern of the path, message name of the body or ""}, ...}
--
-- A query string on any contract route is refused as well (400
-- QUERY_NOT_ALLOWED): the transcoder would read fields from it too, the path's
-- model or pool overridden by `?model=` / `?name=` (DELETE /v1/pools/p?name=q
-- deleted q) and a `?dims=` dropped under the body's `dims`. ROUTES then lists
-- every route, a body's message "" where it has none.

local MAX_DEPTH = 64
-- the longest key a refusal quotes (the whole path is cut at 200 too)
local MAX_KEY = 200

local function skip_space(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

-- JSON's one-character escapes.
local ESCAPES = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}

-- The string starting at s[i] == '"': the index after it (nil when it is not well-formed) and,
-- with `decode`, its text. A \u escape beyond ASCII stays as written: no field name has one.
local function read_string(s, i, decode)
  local j = i + 1
  local parts = decode and {} or nil
  while true do
    local k = s:find('["\\]', j)
    if not k then
      return nil
    end
    if parts then
      parts[#parts + 1] = s:sub(j, k - 1)
    end
    if s:byte(k) == 34 then -- '"'
      return k + 1, parts and table.concat(parts)
    end
    local c = s:sub(k + 1, k + 1)
    if c == "u" then
      local hex = s:match("^%x%x%x%x", k + 2)
      if not hex then
        return nil
      end
      if parts then
        local code = tonumber(hex, 16)
        parts[#parts + 1] = code < 128 and string.char(code) or s:sub(k, k + 5)
      end
      j = k + 6
    elseif ESCAPES[c] then
      if parts then
        parts[#parts + 1] = ESCAPES[c]
      end
      j = k + 2
    else
      return nil
    end
  end
end

-- A failure is the byte index where the JSON stops being strict JSON, {deep = index}, or an
-- unknown field: {segments = its path, innermost first, known = the fields taken there}.
local function key_segment(key)
  if #key > MAX_KEY then
    key = key:sub(1, MAX_KEY) .. "..."
  end
  return "." .. key
end

local walk

-- An object at s[i]; `schema` nil means any keys. Returns the index after it, or nil and a failure.
local function walk_object(s, i, schema, depth)
  i = skip_space(s, i + 1)
  if s:byte(i) == 125 then -- '}'
    return i + 1
  end
  local checked = schema ~= nil and schema.fields ~= nil
  local seen = checked and {} or nil -- proto names given so far
  while true do
    if s:byte(i) ~= 34 then
      return nil, i
    end
    local start = i
    local key
    i, key = read_string(s, i, checked)
    if not i then
      return nil, start
    end
    local child = nil
    if checked then
      child = schema.fields[key]
      if child == nil then
        return nil, {segments = {key_segment(key)}, known = schema.known, in_path = schema.in_path ~= nil and schema.in_path[key]}
      end
      local name = schema.proto[key] or key
      if seen[name] then
        return nil, {segments = {key_segment(key)}, known = schema.known, duplicate = true}
      end
      seen[name] = true
    elseif schema ~= nil then
      child = schema.map
    end
    i = skip_space(s, i)
    if s:byte(i) ~= 58 then -- ':'
      return nil, i
    end
    local failure
    i, failure = walk(s, i + 1, child, depth + 1)
    if not i then
      if type(failure) == "table" and failure.segments then
        local _, text = read_string(s, start, true)
        failure.segments[#failure.segments + 1] = key_segment(text)
      end
      return nil, failure
    end
    i = skip_space(s, i)
    local c = s:byte(i)
    if c == 44 then -- ','
      i = skip_space(s, i + 1)
    elseif c == 125 then
      return i + 1
    else
      return nil, i
    end
  end
end

local function walk_array(s, i, schema, depth)
  i = skip_space(s, i + 1)
  if s:byte(i) == 93 then -- ']'
    return i + 1
  end
  local index = 0
  while true do
    local failure
    i, failure = walk(s, i, schema, depth + 1)
    if not i then
      if type(failure) == "table" and failure.segments then
        failure.segments[#failure.segments + 1] = "[" .. index .. "]"
      end
      return nil, failure
    end
    i = skip_space(s, i)
    local c = s:byte(i)
    if c == 44 then
      i = i + 1
      index = index + 1
    elseif c == 93 then
      return i + 1
    else
      return nil, i
    end
  end
end

-- The value at s[i] (after spaces); `schema` is false/nil (anything), a message name, or a map.
walk = function(s, i, schema, depth)
  i = skip_space(s, i)
  if depth > MAX_DEPTH then
    return nil, {deep = i}
  end
  if type(schema) == "string" then
    schema = MESSAGES[schema]
  elseif schema == false then
    schema = nil
  end
  local c = s:byte(i)
  if c == 123 then -- '{'
    return walk_object(s, i, schema, depth)
  elseif c == 91 then -- '['
    return walk_array(s, i, schema, depth)
  elseif c == 34 then
    local j = read_string(s, i, false)
    if j then
      return j
    end
    return nil, i
  end
  local j = s:find("[^%w%.%+%-]", i) or #s + 1
  local token = s:sub(i, j - 1)
  if token == "true" or token == "false" or token == "null" or token:find("^%-?%d+%.?%d*[eE]?[%+%-]?%d*$") then
    return j
  end
  return nil, i
end

-- `text` as a JSON string (control characters, quotes and backslashes escaped).
local function json_string(text)
  return '"' .. (text:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end)) .. '"'
end

-- Up to 20 bytes of `text` from byte `i`, quoted, as a hint of where it went wrong.
local function json_excerpt(text, i)
  local excerpt = text:sub(i, i + 19):gsub("[^ -~]", "?")
  if excerpt == "" then
    return "the body ends early"
  end
  return "'" .. excerpt .. "'"
end

-- The JSON error body the transcoder gives gRPC errors: INVALID_ARGUMENT with an ErrorInfo.
local function error_body(message, reason, key, value)
  return '{"code": 3, "message": ' .. json_string(message)
    .. ', "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "' .. reason
    .. '", "domain": "sie", "metadata": {"' .. key .. '": ' .. json_string(value) .. '}}]}'
end

local function refusal(text, failure)
  if type(failure) == "table" and failure.segments then
    local outward = {}
    for k = #failure.segments, 1, -1 do
      outward[#outward + 1] = failure.segments[k]
    end
    local path = table.concat(outward):gsub("^%.", "")
    if #path > 200 then
      path = path:sub(1, 200) .. "..."
    end
    local fields = failure.known == "" and "no fields" or failure.known:gsub(" ", ", ")
    local takes = fields .. " (docs/http.md lists the body shapes)"
    if failure.duplicate then
      return error_body("field '" .. path .. "' is given twice (under its proto or its JSON name); give it once",
        "DUPLICATE_FIELD", "field", path)
    end
    if failure.in_path then
      return error_body("field '" .. path .. "' is given by the path; leave it out of the body, which takes "
        .. takes, "FIELD_IN_PATH", "field", path)
    end
    local message = "unknown field '" .. path .. "': the request has no such field; there it takes " .. takes
    return error_body(message, "UNKNOWN_FIELD", "field", path)
  end
  local message
  local offset
  if type(failure) == "table" then
    offset = failure.deep - 1
    message = "the body nests deeper than " .. MAX_DEPTH .. " levels at byte " .. offset
  else
    offset = failure - 1
    message = "the body is not strict JSON (RFC 8259) at byte " .. offset .. ": "
      .. json_excerpt(text, failure)
  end
  return error_body(message .. " (docs/http.md)", "INVALID_JSON", "offset", tostring(offset))
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local method = headers:get(":method")
  local path, query = (headers:get(":path") or ""):match("^([^?]*)%??(.*)$")
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
  if query ~= "" then
    -- The transcoder would set fields from it too, over the path's model or under the body's value.
    local name = query:match("^[^&=]*"):sub(1, 200)
    local refused = "query parameter '" .. name
      .. "': no route takes one; fields travel in the path or the JSON body (docs/http.md)"
    handle:respond({[":status"] = "400", ["content-type"] = "application/json"},
      error_body(refused, "QUERY_NOT_ALLOWED", "parameter", name))
    return
  end
  if message == "" then
    return
  end
  local body = handle:body()
  if body == nil or body:length() == 0 then
    return
  end
  local text = body:getBytes(0, body:length())
  local start = skip_space(text, 1)
  local ended, failure
  if text:byte(start) ~= 123 then -- the body is one object
    failure = start
  else
    ended, failure = walk(text, start, message, 0)
    if ended ~= nil then
      ended = skip_space(text, ended)
      if ended <= #text then
        failure = ended
      end
    end
  end
  if failure ~= nil then
    handle:respond({[":status"] = "400", ["content-type"] = "application/json"}, refusal(text, failure))
  end
end
