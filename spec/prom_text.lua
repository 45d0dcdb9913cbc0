-- spec/prom_text.lua: a strict reader of the Prometheus text exposition
-- format (0.0.4) for the metrics specs: it checks what promtool does not
-- report as an error but a scrape would get wrong (a family split in two,
-- samples before their TYPE) and returns the samples.
--
--   local P = require "spec.prom_text"
--   local doc = assert(P.parse(text))
--   doc.types["clientpool_live"]        -- "gauge"
--   P.value(doc, "clientpool_live", { pool = "a" })   -- the sample whose labels are exactly these
local P = {}

local function unescape(s)
  return (s:gsub("\\(.)", function(c)
    if c == "n" then return "\n" end
    return c                                  -- \\ and \"
  end))
end

-- name, labels table, value from one sample line, or nil and why.
local function sample(line)
  local name, rest = line:match("^([%a_:][%w_:]*)(.*)$")
  if not name then return nil, "bad sample: " .. line end
  local labels = {}
  if rest:sub(1, 1) == "{" then
    local pos = 2
    while true do
      if rest:sub(pos, pos) == "}" then pos = pos + 1 break end
      local lname, after = rest:match("^([%a_][%w_]*)=\"()", pos)
      if not lname then return nil, "bad label at " .. pos .. ": " .. line end
      local v, i = {}, after
      while true do
        local c = rest:sub(i, i)
        if c == "" then return nil, "unterminated label value: " .. line end
        if c == "\\" then
          v[#v + 1] = rest:sub(i, i + 1)
          i = i + 2
        elseif c == '"' then
          break
        elseif c == "\n" then
          return nil, "raw newline in a label value"
        else
          v[#v + 1] = c
          i = i + 1
        end
      end
      if labels[lname] ~= nil then return nil, "label " .. lname .. " twice: " .. line end
      labels[lname] = unescape(table.concat(v))
      pos = i + 1
      local sep = rest:sub(pos, pos)
      if sep == "," then pos = pos + 1 elseif sep ~= "}" then return nil, "bad separator: " .. line end
    end
    rest = rest:sub(pos)
  end
  local v = rest:match("^ (%S+)$")
  if not v then return nil, "bad value part: " .. line end
  local num
  if v == "+Inf" then num = math.huge elseif v == "-Inf" then num = -math.huge
  elseif v == "NaN" then num = 0 / 0 else num = tonumber(v) end
  if num == nil then return nil, "bad value: " .. line end
  return name, labels, num
end

local SUFFIXES = { "_bucket", "_sum", "_count" }

--- Parses text: { types = name -> type, helps = name -> help, samples =
-- list of { name, labels, value, family } }, or nil and why.
function P.parse(text)
  local doc = { types = {}, helps = {}, samples = {}, order = {} }
  local current, done = nil, {}
  if text:sub(-1) ~= "\n" then return nil, "no final newline" end
  for line in text:gmatch("([^\n]*)\n") do
    local kind, fname, rest = line:match("^# (%u+) ([%a_:][%w_:]*) (.*)$")
    if kind == "HELP" then
      if doc.helps[fname] then return nil, "HELP twice for " .. fname end
      doc.helps[fname] = rest
    elseif kind == "TYPE" then
      if doc.types[fname] then return nil, "TYPE twice for " .. fname end
      if done[fname] then return nil, "family " .. fname .. " split" end
      if current then done[current] = true end
      current = fname
      doc.types[fname] = rest
      doc.order[#doc.order + 1] = fname
    elseif line:sub(1, 1) == "#" or line == "" then
      return nil, "unexpected line: " .. line
    else
      local name, labels, value = sample(line)
      if not name then return nil, labels end
      local fam = name
      if doc.types[current] == "histogram" then
        for _, s in ipairs(SUFFIXES) do
          if name == current .. s then fam = current end
        end
      end
      if fam ~= current then
        return nil, "sample " .. name .. " outside its family (after TYPE " .. tostring(current) .. ")"
      end
      doc.samples[#doc.samples + 1] = { name = name, labels = labels, value = value, family = fam }
    end
  end
  return doc
end

local function same(a, b)
  for k, v in pairs(a) do if b[k] ~= v then return false end end
  for k, v in pairs(b) do if a[k] ~= v then return false end end
  return true
end

--- The value of the sample name{labels} (labels exactly), or nil.
function P.value(doc, name, labels)
  for _, s in ipairs(doc.samples) do
    if s.name == name and same(s.labels, labels or {}) then return s.value end
  end
  return nil
end

--- All samples of name whose labels include the given ones.
function P.select(doc, name, labels)
  local out = {}
  for _, s in ipairs(doc.samples) do
    if s.name == name then
      local ok = true
      for k, v in pairs(labels or {}) do if s.labels[k] ~= v then ok = false end end
      if ok then out[#out + 1] = s end
    end
  end
  return out
end

--- Runs `promtool check metrics` on text: true, or false and its output.
function P.promtool(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  local p = io.popen("promtool check metrics < '" .. path .. "' 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  os.remove(path)
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc == 0, out
end

function P.have_promtool()
  local p = io.popen("command -v promtool 2>/dev/null")
  local out = p:read("*a")
  p:close()
  return out ~= ""
end

return P
