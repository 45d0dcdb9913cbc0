-- clientpool.keyparts (internal): what the managers' keys share
-- (clientpool.ngx.keys, clientpool.http.keys): the escaping of a key's
-- parts and the form of a manager's option errors. Requires nothing.
local error, tonumber = error, tonumber
local string_format, string_gsub, string_char = string.format, string.gsub, string.char

local _M = {}

-- '%' and '|' are escaped in every part, so the encoding is injective.
function _M.esc(s)
  return (string_gsub(s, "[%%|]", function(c) return c == "%" and "%25" or "%7C" end))
end

function _M.unesc(s)
  return (string_gsub(s, "%%(%x%x)", function(h) return string_char(tonumber(h, 16)) end))
end

-- fail(fmt, ...) for a manager: raised without a position ("clientpool.ngx:
-- ..."); the public functions re-raise at their caller.
function _M.failer(name)
  local prefix = name .. ": "
  return function(fmt, ...)
    error(prefix .. string_format(fmt, ...), 0)
  end
end

return _M
