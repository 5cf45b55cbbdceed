-- The request check: runs before Envoy's gRPC-JSON transcoder and refuses what the contract refuses
-- but the transcoder would take (docs/http.md, "What the edge refuses").
--
-- * The path: one trailing slash is dropped (Envoy has already merged duplicate slashes, unescaped
--   %2F and removed dot segments), so the check and the transcoder read the same path; a path over
--   MAX_PATH bytes is refused (414 PATH_TOO_LONG).
-- * A query string on a contract route: 400 QUERY_NOT_ALLOWED (the transcoder would read fields
--   from it, over the path's model or pool name).
-- * The JSON body: it must be one strict JSON object (RFC 8259; the transcoder's parser also takes
--   trailing commas, single quotes, unquoted keys), nest at most MAX_DEPTH levels, name only fields
--   its message defines (UNKNOWN_FIELD), none twice (DUPLICATE_FIELD), none its path gives
--   (FIELD_IN_PATH), and give each field the JSON type the proto3 JSON mapping gives it
--   (WRONG_JSON_TYPE: a list is an array, a message an object, a bool true or false; no null inside
--   a list): the transcoder reads a lone object as a one-item list, drops a null item and takes
--   "true" for a boolean.
--
-- The body is read in one pass, left to right, each byte looked at a bounded number of times: no
-- pattern here can backtrack (every pattern is one character class, anchored, with at most one
-- repetition at its end), so the time is linear in the body. A field's path is spelled out only
-- for a refusal.
--
-- sie_stack.request_check prepends the contract's tables:
-- MESSAGES[name] = {fields = {[JSON name] = spec}, known = its fields' proto names, space-separated,
--                   proto = {[JSON name] = proto name} where they differ (a field given under both
--                   counts twice), in_path = the keys the route's path binds (a body's root only)}
--   spec: "string" | "bytes" | "bool" | "number" | "enum" | "value" (any JSON) | "struct" (any
--         object) | "list_value" (any array) | {message = name} | {list = spec} | {map = spec}
-- ROUTES = {{method, Lua pattern of the path, message of the body or "" for none, gRPC path}, ...}
-- BODY_LIMIT, BODY_BUDGET, PEER_BUDGET, MAX_BODIES, PEER_BODIES, LEASE_S, FEW_CHUNKS, MIN_CHUNK: the body admission
-- (sie_stack.request_check.BodyAdmission, FEW_CHUNKS, MIN_CHUNK_BYTES);
-- OVERLOADED: the JSON body of its 503 (and NOT_FOUND, CHECK_FAILED: the route guard's answers); BAD_TIMEOUT: the JSON
-- body of its 400 for a malformed grpc-timeout header, BAD_TIMEOUT_MESSAGE and BAD_TIMEOUT_DETAILS (a google.rpc.Status,
-- base64) the same refusal to a native gRPC call; HEADERS_TOO_LARGE (431), HEADERS_TOO_LARGE_MESSAGE and
-- HEADERS_TOO_LARGE_DETAILS: those of headers over MAX_HEADER_BYTES.
-- A route whose metadata (under this filter's name) says `adapter` goes to the gateway's HTTP adapter: its
-- body is another protocol's (msgpack, Cohere, TEI), bounded here by size only.
-- NAMESPACE: the dynamic-metadata namespace. The check writes `rpc` there (the gRPC path it
-- checked the request for, which route_guard.lua compares with the transcoder's), `native` for a
-- native gRPC call and `answered` when it refuses (the local-reply mappers leave both alone);
-- `checking` while it reads a JSON body, and then `refusal` and `refusal_status` for the route
-- guard to answer with, or `cut` for the local-reply mapper that answers a body ended early.
--
-- A JSON body is read chunk by chunk as it arrives (see "Body admission" below): Envoy passes the
-- request's headers on to the transcoder and the route guard when the check starts, and the check
-- drains every chunk, so the transcoder gets nothing until the check hands it the whole body it
-- passed. From then on the check cannot answer itself: the route guard, which waits for the
-- transcoded body, answers for it.

local MAX_DEPTH = 64
-- The most JSON values (objects, arrays, strings, numbers, literals) in one body, and the longest number
-- (or number given as a string): the transcoder's time grows with the first and with the square of the
-- second, while the contract's own bounds (SIE_MAX_ITEMS_PER_REQUEST items, SIE_MAX_OPTIONS_BYTES of
-- options) stay far below both.
local MAX_VALUES = 65536
local MAX_NUMBER = 64
-- the longest key a refusal quotes (the whole path is cut at 200 too)
local MAX_KEY = 200
-- values the body being checked may still hold (check_body sets it; a check never yields)
local values_left = 0

local byte, find, sub, concat = string.byte, string.find, string.sub, table.concat

local function skip_space(s, i)
  local c = byte(s, i)
  if c == 32 or c == 10 or c == 13 or c == 9 then
    local _, e = find(s, "^[ \t\r\n]*", i)
    return e + 1
  end
  return i
end

-- JSON's one-character escapes.
local ESCAPES = {[34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f", [110] = "\n", [114] = "\r",
  [116] = "\t"}

-- The string starting at s[i] == '"': the index after it, or nil and the index where it stops being a
-- JSON string (a raw control character, a bad escape, no closing quote); with `decode` also its text
-- (a \u escape beyond ASCII stays as written: no field name has one). A plain byte loop: LuaJIT
-- compiles it, where a pattern search per escape would run interpreted.
local function read_string(s, i, decode)
  local n = #s
  local j = i + 1 -- the start of the current run of plain characters
  local k = j
  local parts = decode and {} or nil
  while k <= n do
    local c = byte(s, k)
    if c == 34 then -- '"'
      if parts then
        parts[#parts + 1] = sub(s, j, k - 1)
        return k + 1, concat(parts)
      end
      return k + 1
    elseif c == 92 then -- '\\'
      local e = byte(s, k + 1)
      local escaped
      if e == 117 then -- 'u'
        local _, last = find(s, "^%x%x%x%x", k + 2)
        if not last then
          return nil, k
        end
        if parts then
          local code = tonumber(sub(s, k + 2, last), 16)
          escaped = code < 128 and string.char(code) or sub(s, k, last)
        end
        e = last
      elseif ESCAPES[e] then
        escaped = ESCAPES[e]
        e = k + 1
      else
        return nil, k
      end
      if parts then
        parts[#parts + 1] = sub(s, j, k - 1)
        parts[#parts + 1] = escaped
      end
      k = e + 1
      j = k
    elseif c < 32 then -- a raw control character
      return nil, k
    else
      k = k + 1
    end
  end
  return nil, n + 1
end

-- The number starting at s[i]: the index after it, or nil and where it stops being a JSON number.
local function read_number(s, i)
  local j = i
  if byte(s, j) == 45 then -- '-'
    j = j + 1
  end
  local c = byte(s, j)
  if c == 48 then -- a leading 0 stands alone
    j = j + 1
  elseif c and c >= 49 and c <= 57 then
    local _, e = find(s, "^%d*", j + 1)
    j = e + 1
  else
    return nil, j
  end
  if byte(s, j) == 46 then -- '.'
    local _, e = find(s, "^%d+", j + 1)
    if not e then
      return nil, j + 1
    end
    j = e + 1
  end
  c = byte(s, j)
  if c == 101 or c == 69 then -- 'e', 'E'
    j = j + 1
    c = byte(s, j)
    if c == 43 or c == 45 then
      j = j + 1
    end
    local _, e = find(s, "^%d+", j)
    if not e then
      return nil, j
    end
    j = e + 1
  end
  return j
end

-- JSON types as the first byte of a value shows them.
local OBJECT, ARRAY, STRING, NUMBER, BOOL, NULL = "an object", "an array", "a string", "a number", "a boolean", "null"
local FIRST = {[123] = OBJECT, [91] = ARRAY, [34] = STRING, [116] = BOOL, [102] = BOOL, [110] = NULL, [45] = NUMBER}
for digit = 48, 57 do
  FIRST[digit] = NUMBER
end

-- What each kind takes (null is the field's default in the proto3 JSON mapping, except inside a list or
-- a map, where only a free-form value may be null).
local TAKES = {
  string = {[STRING] = true},
  bytes = {[STRING] = true},
  bool = {[BOOL] = true},
  number = {[NUMBER] = true, [STRING] = true},
  enum = {[STRING] = true, [NUMBER] = true},
  struct = {[OBJECT] = true},
  list_value = {[ARRAY] = true},
}
local EXPECTED = {
  string = "a string", bytes = "a string (base64)", bool = "true or false", number = "a number",
  enum = "a string or a number", struct = "an object", list_value = "an array",
}

-- A failure: {at = byte index} where the body stops being strict JSON, {deep = index} (too deep),
-- {many = index} (too many values), {long = index} (a number too long), or a field's fault:
-- {segments = its path, innermost first, kind = "unknown" | "duplicate" | "in_path" | "type", ...}.
local function key_segment(key)
  if #key > MAX_KEY then
    key = sub(key, 1, MAX_KEY) .. "..."
  end
  return "." .. key
end

local walk

-- After an object's member or an array's element: the index of the next one and false, the index after
-- the container and true when `close` ends it, or nil and a failure.
local function next_entry(s, i, close)
  i = skip_space(s, i)
  local c = byte(s, i)
  if c == 44 then -- ','
    return skip_space(s, i + 1), false
  elseif c == close then
    return i + 1, true
  end
  return nil, {at = i}
end

-- An object at s[i] == '{'. `schema`: a message's entry (its keys are checked), or nil with `values` the
-- spec of every value (a map, a Struct).
local function walk_object(s, i, schema, values, depth)
  i = skip_space(s, i + 1)
  if byte(s, i) == 125 then -- '}'
    return i + 1
  end
  local seen = schema and {} or nil -- proto names given so far
  while true do
    if byte(s, i) ~= 34 then
      return nil, {at = i}
    end
    local start = i
    local key
    i, key = read_string(s, i, schema ~= nil)
    if not i then
      return nil, {at = key}
    end
    local child = values
    if schema then
      child = schema.fields[key]
      if child == nil then
        local kind = schema.in_path ~= nil and schema.in_path[key] and "in_path" or "unknown"
        return nil, {segments = {key_segment(key)}, known = schema.known, kind = kind}
      end
      local name = schema.proto[key] or key
      if seen[name] then
        return nil, {segments = {key_segment(key)}, known = schema.known, kind = "duplicate"}
      end
      seen[name] = true
    end
    i = skip_space(s, i)
    if byte(s, i) ~= 58 then -- ':'
      return nil, {at = i}
    end
    local failure
    i, failure = walk(s, skip_space(s, i + 1), child, depth + 1, values ~= nil and values ~= "value")
    if not i then
      if failure.segments then
        local _, text = read_string(s, start, true)
        failure.segments[#failure.segments + 1] = key_segment(text)
      end
      return nil, failure
    end
    local ended
    i, ended = next_entry(s, i, 125) -- '}'
    if i == nil or ended then
      return i, ended
    end
  end
end

-- An array at s[i] == '['; every element is of `spec` (and none is null unless `spec` is "value").
local function walk_array(s, i, spec, depth)
  i = skip_space(s, i + 1)
  if byte(s, i) == 93 then -- ']'
    return i + 1
  end
  local index = 0
  local no_null = spec ~= "value"
  while true do
    local failure
    i, failure = walk(s, i, spec, depth + 1, no_null)
    if not i then
      if failure.segments then
        failure.segments[#failure.segments + 1] = "[" .. index .. "]"
      end
      return nil, failure
    end
    local ended
    i, ended = next_entry(s, i, 93) -- ']'
    if i == nil or ended then
      return i, ended
    end
    index = index + 1
  end
end

local function wrong_type(expected, got)
  return nil, {segments = {}, kind = "type", expected = expected, got = got}
end

-- The value at s[i] (spaces skipped) of `spec`; `no_null`: an element of a list or a map (null is not one).
walk = function(s, i, spec, depth, no_null)
  if depth > MAX_DEPTH then
    return nil, {deep = i}
  end
  values_left = values_left - 1
  if values_left < 0 then
    return nil, {many = i}
  end
  local c = byte(s, i)
  local got = FIRST[c]
  if got == nil then
    return nil, {at = i}
  end
  if got == NULL and no_null then
    return wrong_type("a value (a list or a map holds no null)", NULL)
  end
  -- the type check: what the spec takes, and what to walk an object's or an array's insides with
  local schema, values, elements = nil, "value", "value"
  if type(spec) == "table" then
    if spec.message then
      if got ~= OBJECT and got ~= NULL then
        return wrong_type("an object", got)
      end
      schema = MESSAGES[spec.message]
    elseif spec.list then
      if got ~= ARRAY and got ~= NULL then
        return wrong_type("an array", got)
      end
      elements = spec.list
    elseif got ~= OBJECT and got ~= NULL then -- a map
      return wrong_type("an object", got)
    else
      values = spec.map
    end
  elseif spec ~= "value" and got ~= NULL and not TAKES[spec][got] then
    return wrong_type(EXPECTED[spec], got)
  end
  if got == OBJECT then
    return walk_object(s, i, schema, schema == nil and values or nil, depth)
  elseif got == ARRAY then
    return walk_array(s, i, elements, depth)
  elseif got == STRING then
    local j, stop = read_string(s, i, false)
    if not j then
      return nil, {at = stop}
    end
    if spec == "number" and j - i - 2 > MAX_NUMBER then
      return nil, {long = i}
    end
    return j
  elseif got == NUMBER then
    local j, stop = read_number(s, i)
    if not j then
      return nil, {at = stop}
    end
    if j - i > MAX_NUMBER then
      return nil, {long = i}
    end
    return j
  end
  local word = c == 116 and "true" or c == 102 and "false" or "null"
  if sub(s, i, i + #word - 1) == word then
    return i + #word
  end
  return nil, {at = i}
end

-- `text` as a JSON string (control characters, quotes and backslashes escaped; a byte past ASCII as '?': a caller's
-- key or parameter may not be UTF-8, which made the refusal's body no JSON at all, and every name of the contract is
-- ASCII).
local function json_string(text)
  text = text:gsub("[\128-\255]", "?")
  return '"' .. (text:gsub('[%c"\\]', function(ch) return string.format("\\u%04x", ch:byte()) end)) .. '"'
end

-- Up to 20 bytes of `text` from byte `i`, quoted, as a hint of where it went wrong.
local function json_excerpt(text, i)
  local excerpt = sub(text, i, i + 19):gsub("[^ -~]", "?")
  if excerpt == "" then
    return "the body ends early"
  end
  return "'" .. excerpt .. "'"
end

-- The JSON error body the transcoder gives gRPC errors: INVALID_ARGUMENT with an ErrorInfo.
local function error_body(message, reason, metadata)
  local entries = {}
  for _, entry in ipairs(metadata) do
    entries[#entries + 1] = json_string(entry[1]) .. ": " .. json_string(entry[2])
  end
  return '{"code": 3, "message": ' .. json_string(message)
    .. ', "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "' .. reason
    .. '", "domain": "sie", "metadata": {' .. concat(entries, ", ") .. '}}]}'
end

local function field_refusal(failure)
  local outward = {}
  for k = #failure.segments, 1, -1 do
    outward[#outward + 1] = failure.segments[k]
  end
  local path = concat(outward):gsub("^%.", "")
  if #path > 200 then
    path = sub(path, 1, 200) .. "..."
  end
  local field = {{"field", path}}
  if failure.kind == "type" then
    local where = path == "" and "the body" or "field '" .. path .. "'"
    return error_body(where .. " must be " .. failure.expected .. ", not " .. failure.got
      .. " (the proto3 JSON mapping; docs/http.md lists the body shapes)", "WRONG_JSON_TYPE",
      {{"field", path}, {"expected", failure.expected}})
  end
  local fields = failure.known == "" and "no fields" or failure.known:gsub(" ", ", ")
  local takes = fields .. " (docs/http.md lists the body shapes)"
  if failure.kind == "duplicate" then
    return error_body("field '" .. path .. "' is given twice (under its proto or its JSON name); give it once",
      "DUPLICATE_FIELD", field)
  end
  if failure.kind == "in_path" then
    return error_body("field '" .. path .. "' is given by the path; leave it out of the body, which takes "
      .. takes, "FIELD_IN_PATH", field)
  end
  return error_body("unknown field '" .. path .. "': the request has no such field; there it takes " .. takes,
    "UNKNOWN_FIELD", field)
end

local function refusal(text, failure)
  if failure.segments then
    return field_refusal(failure)
  end
  local offset, message
  if failure.many then
    return error_body("the body holds more than " .. MAX_VALUES .. " JSON values (a request holds at most "
      .. "SIE_MAX_ITEMS_PER_REQUEST items; docs/http.md)", "TOO_MANY_VALUES", {{"limit", tostring(MAX_VALUES)}})
  elseif failure.long then
    offset = failure.long - 1
    return error_body("the number at byte " .. offset .. " is longer than " .. MAX_NUMBER .. " characters "
      .. "(docs/http.md)", "NUMBER_TOO_LONG", {{"offset", tostring(offset)}, {"limit", tostring(MAX_NUMBER)}})
  elseif failure.deep then
    offset = failure.deep - 1
    message = "the body nests deeper than " .. MAX_DEPTH .. " levels at byte " .. offset
  else
    offset = failure.at - 1
    message = "the body is not strict JSON (RFC 8259) at byte " .. offset .. ": " .. json_excerpt(text, failure.at)
  end
  return error_body(message .. " (docs/http.md)", "INVALID_JSON", {{"offset", tostring(offset)}})
end

-- The refusal of a body of route message `message` (nil when it passes).
local function check_body(text, message)
  local start = skip_space(text, 1)
  if byte(text, start) ~= 123 then -- the body is one object
    return refusal(text, {at = start})
  end
  values_left = MAX_VALUES
  local ended, failure = walk(text, start, {message = message}, 0, false)
  if ended == nil then
    return refusal(text, failure)
  end
  ended = skip_space(text, ended)
  if ended <= #text then
    return refusal(text, {at = ended})
  end
  return nil
end

-- Body admission. The check keeps each JSON body's chunks (in this Lua state) until it has all of
-- it, so a body holds memory only as far as it has arrived: each chunk is leased from this worker
-- thread's BODY_BUDGET as it comes, and a chunk that does not fit ends its request at once (503
-- OVERLOADED); a body that announces much and sends little holds little. Bodies that have reached
-- LARGE bytes may hold at most three quarters of the budget together, so slow senders of big bodies
-- leave room for everyone's small ones, and the bodies of one peer (one client address) at most
-- PEER_BUDGET, so one client cannot take it all. A request waiting for its body costs Envoy some 30 KB
-- however little it sends, so at most MAX_BODIES bodies (PEER_BODIES of one peer) arrive at once, and
-- RESERVED_BODIES more for addresses holding almost none.
-- A lease is keyed by its request's coroutine, weakly: when a request ends without a word (reset,
-- timed out) Envoy drops its coroutine and the next purge (a full collection, when a lease does not
-- fit, at most every PURGE_GAP_MS, and after every COLLECT_EVERY bytes leased) returns its bytes;
-- LEASE_S bounds a lease in any case. Envoy's Lua has no hook at a stream's end (only
-- envoy_on_request and envoy_on_response, and a reset stream gets no response), so a collection is
-- the only way to learn that one ended. Times are Envoy's clock in milliseconds (handle:timestamp()).
-- The collections also free the chunks of bodies that are done, which would otherwise wait for Lua's
-- own collector.
local LARGE = 65536
local LARGE_BUDGET = BODY_BUDGET * 3 / 4
local COLLECT_EVERY = math.max(BODY_BUDGET / 8, LARGE)
local leases = setmetatable({}, {__mode = "k"}) -- coroutine -> {bytes =, peer =, expiry =, open =}
local held, held_large, bodies, by_peer = 0, 0, 0, {} -- by_peer: peer -> {bytes =, bodies =}
local last_purge, since_collect = 0, 0
-- A purge when a lease does not fit waits this long after the last one: a lease of a request reset just
-- before comes back that much late at most (it was up to a second), and a flood of refused requests
-- costs at most 1000 / PURGE_GAP_MS full collections a second.
local PURGE_GAP_MS = 20
-- Places for bodies past MAX_BODIES, each address RESERVE_PER_PEER of them at most, for addresses that hold fewer than
-- that: two addresses filling their PEER_BODIES each took every place (a third's 1 KB body was 503 OVERLOADED until
-- Envoy's request timeout); now they must be joined by RESERVED_BODIES / RESERVE_PER_PEER more addresses.
local RESERVED_BODIES = math.floor(MAX_BODIES / 4)
local RESERVE_PER_PEER = 8

-- Whether `lease` may grow by `bytes` (and, while it is not yet `open`, be one more body).
local function fits(lease, bytes)
  local peer = by_peer[lease.peer] or {bytes = 0, bodies = 0}
  if held + bytes > BODY_BUDGET or peer.bytes + bytes > PEER_BUDGET then
    return false
  end
  if not lease.open and (peer.bodies >= PEER_BODIES or bodies >= MAX_BODIES + RESERVED_BODIES
      or (bodies >= MAX_BODIES and peer.bodies >= RESERVE_PER_PEER)) then
    return false
  end
  return lease.bytes + bytes < LARGE or held_large + bytes + (lease.bytes < LARGE and lease.bytes or 0) <= LARGE_BUDGET
end

local function count(lease, sign)
  held = held + sign * lease.bytes
  if lease.bytes >= LARGE then
    held_large = held_large + sign * lease.bytes
  end
  bodies = bodies + sign
  local peer = by_peer[lease.peer] or {bytes = 0, bodies = 0}
  peer.bytes, peer.bodies = peer.bytes + sign * lease.bytes, peer.bodies + sign
  by_peer[lease.peer] = peer.bodies > 0 and peer or nil
end

local function purge(now)
  collectgarbage()
  since_collect = 0
  held, held_large, bodies, by_peer = 0, 0, 0, {}
  for owner, lease in pairs(leases) do
    if lease.expiry <= now then
      leases[owner] = nil
    else
      count(lease, 1)
    end
  end
end

-- `bytes` more allocated in this Lua state (chunks, a whole body) at `now`: a full collection after every
-- COLLECT_EVERY.
local function allocated(bytes, now)
  since_collect = since_collect + bytes
  if since_collect >= COLLECT_EVERY then
    purge(now)
  end
end

-- Whether `lease` could grow by `bytes` at `now`, purging first if it could not (at most every PURGE_GAP_MS; and
-- when the clock went back, which would otherwise put the next purge off by as much).
local function room(lease, bytes, now)
  if fits(lease, bytes) then
    return true
  end
  if now >= last_purge + PURGE_GAP_MS or now < last_purge then
    last_purge = now
    purge(now)
  end
  return fits(lease, bytes)
end

-- A lease of nothing for the running request's body, from `peer`, when the thread (and the peer) may take one more
-- body and has room for `bytes` of it at `now`; nil when not.
local function open_lease(peer, bytes, now)
  local lease = {bytes = 0, peer = peer, expiry = now + LEASE_S * 1000}
  if not room(lease, bytes, now) then
    return nil
  end
  lease.open = true
  leases[coroutine.running()] = lease
  count(lease, 1)
  return lease
end

-- Grows `lease` by `bytes` at `now` (true), or nil when they do not fit.
local function grow(lease, bytes, now)
  if not room(lease, bytes, now) then
    return nil
  end
  count(lease, -1)
  lease.bytes = lease.bytes + bytes
  count(lease, 1)
  allocated(bytes, now)
  return true
end

local function release(lease)
  if leases[coroutine.running()] == lease then
    leases[coroutine.running()] = nil
    count(lease, -1)
  end
end

-- The client's address without its port (one peer's requests share PEER_BUDGET): the connection's own peer, not the
-- address Envoy takes from x-forwarded-for (any client may send one; a new value per connection was a new peer).
local function peer_of(handle)
  local address = handle:streamInfo():downstreamDirectRemoteAddress()
  return address:match("^(.*):%d+$") or address
end

local function respond(handle, status, body)
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "answered", true)
  handle:respond({[":status"] = status, ["content-type"] = "application/json"}, body)
end

-- Whether Envoy takes the request as native gRPC (the transcoder leaves it alone): application/grpc or
-- application/grpc+...; "application/grpc; charset=utf-8" is transcoded as JSON.
local function is_grpc(content_type)
  return content_type == "application/grpc" or find(content_type, "^application/grpc%+") ~= nil
end

-- A refusal the route guard (behind the transcoder) gives once the body is in: the check's own headers went on to the
-- transcoder when it began reading the body chunk by chunk (Envoy passes them on then), so it can no longer answer.
local function refuse_later(handle, status, body)
  local mark = handle:streamInfo():dynamicMetadata()
  mark:set(NAMESPACE, "refusal", body)
  mark:set(NAMESPACE, "refusal_status", status)
end

-- What the transcoder's JSON parser refuses as soon as it reads it: a body cannot start with a closing bracket (it
-- waits for more on fewer than 5 bytes, or on a byte that starts no JSON token).
local UNREADABLE = "]]]]]]]]"

-- Ends the request at `chunk`, before the rest of its body is read, with the answer of the local-reply mapper keyed on
-- `cut` = `reason` (sie_stack.envoy_config): the chunk becomes what the transcoder cannot read, so it answers at once
-- with a 400, which that mapper turns into `reason`'s answer.
local function cut(handle, chunk, reason)
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "cut", reason)
  chunk:setBytes(UNREADABLE)
end

-- An AddModel the check refuses that carries no credential gets the config service's own answer to a call without
-- one (401 MISSING_TOKEN), not the body's faults: authentication comes first (the config service checks the token
-- before it reads a request; the check here cannot tell a right token from a wrong one).
local ADD_MODEL = "/sie.v1.ConfigService/AddModel"
local MISSING_ADMIN_TOKEN = '{"code": 16, "message": "add models needs an \'authorization: Bearer <token>\' header '
  .. '(the config service\'s SIE_ADMIN_TOKEN)", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", '
  .. '"reason": "MISSING_TOKEN", "domain": "sie", "metadata": {}}]}'

-- Reads the body of `route` chunk by chunk, each leased as it arrives and drained (the transcoder behind gets nothing
-- until the check has all of it), checks it, and hands it on whole; a refusal goes to the route guard.
-- `anonymous`: the request has no authorization header.
local function check_chunks(handle, route, lease, anonymous)
  local parts, pieces, size, last = {}, 0, 0, nil
  for chunk in handle:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      size = size + n
      if size > BODY_LIMIT then -- sent without a content-length, or more than it said
        release(lease)
        cut(handle, chunk, "BODY_TOO_LARGE")
        return
      end
      pieces = pieces + 1
      if pieces > FEW_CHUNKS and pieces * MIN_CHUNK > size then -- (why: sie_stack.request_check.FEW_CHUNKS)
        release(lease)
        cut(handle, chunk, "CHUNKS_TOO_SMALL")
        return
      end
      if not grow(lease, n, handle:timestamp()) then
        release(lease)
        cut(handle, chunk, "OVERLOADED")
        return
      end
      parts[pieces] = chunk:getBytes(0, n)
      chunk:setBytes("")
    end
    last = chunk -- alive until this resume ends: the loop ends in the resume that brings the body's last chunk
  end
  if handle:trailers() ~= nil then -- the body ended in trailers: no chunk is left to hand it on in
    release(lease)
    refuse_later(handle, "400", error_body("a JSON body may not end in trailers: send it without them (docs/http.md)",
      "TRAILERS_NOT_ALLOWED", {}))
    return
  end
  release(lease)
  if size == 0 then -- no body: the transcoder reads none as an empty message, as it would have
    handle:streamInfo():dynamicMetadata():set(NAMESPACE, "rpc", route[4])
    return
  end
  local text = concat(parts)
  parts = nil
  local ok, refused = pcall(check_body, text, route[3])
  if not ok then -- a fault of this script: nothing unchecked goes on
    refuse_later(handle, "500", error_body("the request check failed: " .. tostring(refused):sub(1, 200),
      "EDGE_ERROR", {}))
  elseif refused ~= nil and anonymous and route[4] == ADD_MODEL then
    refuse_later(handle, "401", MISSING_ADMIN_TOKEN)
  elseif refused ~= nil then
    refuse_later(handle, "400", refused)
  else
    handle:streamInfo():dynamicMetadata():set(NAMESPACE, "rpc", route[4])
    last:setBytes(text)
  end
  text = nil
  allocated(size, handle:timestamp())
end

-- gRPC's TimeoutValue TimeoutUnit: 1 to 8 digits and a unit.
local GRPC_TIMEOUT = "^%d%d?%d?%d?%d?%d?%d?%d?[HMSmun]$"

-- The check's refusal to a native gRPC call: a trailers-only answer with INVALID_ARGUMENT, `message` and `details` (a
-- google.rpc.Status, base64, its ErrorInfo with the reason).
local function respond_grpc(handle, message, details)
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "answered", true)
  handle:respond({[":status"] = "200", ["content-type"] = "application/grpc", ["grpc-status"] = "3",
    ["grpc-message"] = message, ["grpc-status-details-bin"] = details}, "")
end

-- The request's headers as HTTP/2 and grpc count a header list: name, value and 32 bytes each.
local function header_bytes(headers)
  local size = 0
  for key, value in pairs(headers) do
    size = size + #key + #value + 32
  end
  return size
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local raw = headers:get(":path") or ""
  local grpc = is_grpc(headers:get("content-type") or "")
  if header_bytes(headers) > MAX_HEADER_BYTES then
    if grpc then
      respond_grpc(handle, HEADERS_TOO_LARGE_MESSAGE, HEADERS_TOO_LARGE_DETAILS)
    else
      respond(handle, "431", HEADERS_TOO_LARGE)
    end
    return
  end
  local timeout = headers:get("grpc-timeout")
  if timeout ~= nil and not find(timeout, GRPC_TIMEOUT) then
    if grpc then
      respond_grpc(handle, BAD_TIMEOUT_MESSAGE, BAD_TIMEOUT_DETAILS)
    else
      respond(handle, "400", BAD_TIMEOUT)
    end
    return
  end
  if grpc then
    local mark = handle:streamInfo():dynamicMetadata()
    mark:set(NAMESPACE, "rpc", raw)
    mark:set(NAMESPACE, "native", true)
    return
  end
  local q = find(raw, "?", 1, true)
  local path = q and sub(raw, 1, q - 1) or raw
  if #path > MAX_PATH then
    respond(handle, "414", error_body("the path has " .. #path .. " bytes; the limit is " .. MAX_PATH
      .. " (a model id is at most SIE_MAX_NAME_BYTES; docs/http.md)", "PATH_TOO_LONG", {{"limit", tostring(MAX_PATH)}}))
    return
  end
  if #path > 1 and byte(path, #path) == 47 then -- '/': the path without its trailing slash, for the transcoder too
    path = sub(path, 1, #path - 1)
    headers:replace(":path", q and path .. sub(raw, q) or path)
    handle:clearRouteCache()
  end
  if handle:metadata():get("adapter") then
    -- A route to the HTTP adapter (another client's protocol: msgpack, rerank, TEI): not a body of the contract;
    -- the adapter reads it within its own bounds. Its size is still bounded here, from its content-length.
    local length = tonumber(headers:get("content-length") or "0") or 0
    if length > BODY_LIMIT then
      respond(handle, "413", error_body("the body has " .. length .. " bytes; the limit is " .. BODY_LIMIT
        .. ": send fewer or smaller items per request", "BODY_TOO_LARGE", {{"limit", tostring(BODY_LIMIT)}}))
    end
    return
  end
  local method = headers:get(":method")
  local route = nil
  for _, candidate in ipairs(ROUTES) do
    if candidate[1] == method and find(path, candidate[2]) then
      route = candidate
      break
    end
  end
  if route == nil then
    return
  end
  if q then
    -- The transcoder would set fields from it too, over the path's model or under the body's value.
    local name = sub(raw, q + 1):match("^[^&=]*"):sub(1, 200)
    respond(handle, "400", error_body("query parameter '" .. name
      .. "': no route takes one; fields travel in the path or the JSON body (docs/http.md)",
      "QUERY_NOT_ALLOWED", {{"parameter", name}}))
    return
  end
  if route[3] ~= "" then
    local length = headers:get("content-length")
    local announced = length and tonumber(length)
    if announced and announced > BODY_LIMIT then
      respond(handle, "413", error_body("the body has " .. announced .. " bytes; the limit is " .. BODY_LIMIT
        .. " (the services' SIE_MAX_RECEIVE_MESSAGE_BYTES): send fewer or smaller items per request",
        "BODY_TOO_LARGE", {{"limit", tostring(BODY_LIMIT)}}))
      return
    end
    -- Refused at once while the thread (or this peer) has as many bodies coming as it may, or no room for the start
    -- of this one.
    local lease = open_lease(peer_of(handle), math.min(announced or LARGE, LARGE), handle:timestamp())
    if lease == nil then
      handle:streamInfo():dynamicMetadata():set(NAMESPACE, "answered", true)
      handle:respond({[":status"] = "503", ["content-type"] = "application/json", ["retry-after"] = "1"}, OVERLOADED)
      return
    end
    handle:streamInfo():dynamicMetadata():set(NAMESPACE, "checking", true)
    check_chunks(handle, route, lease, headers:get("authorization") == nil)
    return
  end
  -- A route without a body (GET, DELETE): the transcoder would still read one, its fields over the path's (`DELETE
  -- /v1/pools/a` with {"name": "b"} deleted pool b), so the first byte of one ends the request: 400 BODY_NOT_ALLOWED.
  -- Nothing is kept, so nothing is leased; a request without a body ends at its headers and goes on at once.
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "checking", true)
  for chunk in handle:bodyChunks() do
    if chunk:length() > 0 then
      cut(handle, chunk, "BODY_NOT_ALLOWED")
      return
    end
  end
  handle:streamInfo():dynamicMetadata():set(NAMESPACE, "rpc", route[4])
end
