--- clientpool.fleet_ffi: the LuaJIT FFI binding of the machine-local fleet
-- (csrc/fleet.h), the same surface as clientpool.core.fleet (csrc/lfleet.c):
-- open, remove, shm_name, strerror, the constants, and handles with the
-- same methods, arguments and results. clientpool.fleet picks it on
-- LuaJIT, where calls through the C API are not compiled and FFI calls are.
--
-- A hot call (take, give, seq, poll) allocates nothing; each handle owns
-- its scratch structs. A handle is closed by close() or by the collector
-- (ffi.gc); a closed handle swaps its metatable so every later call raises.
local ffi = require "ffi"
local ffibase = require "clientpool.ffibase"

local C = ffibase.library("clientpool.fleet_ffi", "clientpool_fleet_limits_t", "clientpool.fleet_cdef")

local error, setmetatable, tonumber, tostring, type = error, setmetatable, tonumber, tostring, type
local ffi_gc, ffi_string, ffi_new = ffi.gc, ffi.string, ffi.new

local _M = {
  _NAME = "clientpool.core.fleet",
  LIVE = C.CLIENTPOOL_FLEET_LIVE, IDLE = C.CLIENTPOOL_FLEET_IDLE, LEASE = C.CLIENTPOOL_FLEET_LEASE,
  FLOOR = C.CLIENTPOOL_FLEET_FLOOR, TAKEN = C.CLIENTPOOL_FLEET_TAKEN, REFUSED = C.CLIENTPOOL_FLEET_REFUSED,
  REFUSED_KEY = C.CLIENTPOOL_FLEET_REFUSED_KEY, REFUSED_TURN = C.CLIENTPOOL_FLEET_REFUSED_TURN,
  NAME_MAX = C.CLIENTPOOL_FLEET_NAME_MAX, KEY_MAX = C.CLIENTPOOL_FLEET_KEY_MAX,
  REASON_MAX = C.CLIENTPOOL_FLEET_REASON_MAX,
}

-- Error names, as lfleet.c's err_name gives them.
local ERR = {
  [C.CLIENTPOOL_FLEET_EINVAL] = "einval", [C.CLIENTPOOL_FLEET_ENOMEM] = "enomem",
  [C.CLIENTPOOL_FLEET_ENOENT] = "enoent", [C.CLIENTPOOL_FLEET_EACCES] = "eacces",
  [C.CLIENTPOOL_FLEET_ECORRUPT] = "ecorrupt", [C.CLIENTPOOL_FLEET_EVERSION] = "eversion",
  [C.CLIENTPOOL_FLEET_EGEOMETRY] = "egeometry", [C.CLIENTPOOL_FLEET_ENAME] = "ename",
  [C.CLIENTPOOL_FLEET_EMEMBERS] = "emembers", [C.CLIENTPOOL_FLEET_EKEYS] = "ekeys",
  [C.CLIENTPOOL_FLEET_EBUSY] = "ebusy", [C.CLIENTPOOL_FLEET_ENOTMEMBER] = "enotmember",
  [C.CLIENTPOOL_FLEET_ESYS] = "esys", [C.CLIENTPOOL_FLEET_ENOTHELD] = "enotheld",
  [C.CLIENTPOOL_FLEET_ETIMEDOUT] = "etimedout",
  [C.CLIENTPOOL_FLEET_ESTALE] = "estale",
}

local function fail(code, msg)
  if msg == nil or msg == "" then msg = ffi_string(C.clientpool_fleet_strerror(code)) end
  return nil, ERR[code] or "unknown", msg
end

local function status(rc)
  if rc < 0 then return fail(rc) end
  return true
end

local function argerr(n, fname, msg)
  error("bad argument #" .. n .. " to '" .. fname .. "' (" .. msg .. ")", 3)
end

local function check_str(v, n, fname)
  if type(v) == "number" then return tostring(v) end
  if type(v) ~= "string" then argerr(n, fname, "string expected, got " .. (v == nil and "no value" or type(v))) end
  return v
end

local function check_int(v, n, fname, dflt)
  if v == nil and dflt ~= nil then return dflt end
  if type(v) ~= "number" then argerr(n, fname, "number expected, got " .. (v == nil and "no value" or type(v))) end
  return v
end

-- (a handle's own scratch cells are made by name in open(), once a handle)
local limits_t = ffi.typeof("clientpool_fleet_limits_t")
local handle_pp = ffi.typeof("clientpool_fleet_t *[1]")
local errbuf_t = ffi.typeof("char[320]")
local namebuf_t = ffi.typeof("char[96]")

-- After close(): every method raises, as lfleet.c's do.
local Fleet, fleet_mt, closed_mt = ffibase.handle_type("clientpool.Fleet", "close", "closed", "fleet handle")

local function limit(t, field, dflt)
  local v = t[field]
  if v == nil then return dflt end
  if type(v) ~= "number" or v ~= v or v < -2147483648 or v > 2147483647 then
    error("clientpool: fleet limit '" .. field .. "' must be a 32-bit integer", 3)
  end
  return v
end

-- A limits table into a clientpool_fleet_limits_t (lfleet.c's read_limits).
local function read_limits(lim, n, fname)
  if type(lim) ~= "table" then argerr(n, fname, "table expected, got " .. type(lim)) end
  local max_live = limit(lim, "max_live", 0)
  local lp = limits_t()
  lp.max_live = max_live
  lp.max_idle = limit(lim, "max_idle", max_live)
  lp.min_idle = limit(lim, "min_idle", 0)
  lp.max_concurrency = limit(lim, "max_concurrency", max_live)
  lp.key_max_live = limit(lim, "key_max_live", -1)
  lp.key_max_idle = limit(lim, "key_max_idle", -1)
  lp.max_keys = limit(lim, "max_keys", 256)
  lp.members = limit(lim, "members", 64)
  lp.attempts = limit(lim, "attempts", 3)
  return lp
end

--- open(name [, limits]) -> handle, created | nil, err, message
function _M.open(name, lim)
  name = check_str(name, 1, "open")
  local lp = nil
  if lim ~= nil then lp = read_limits(lim, 2, "open") end
  local out, err = handle_pp(), errbuf_t()
  local rc = C.clientpool_fleet_open(name, #name, lp, out, err, 320)
  if rc < 0 then return fail(rc, ffi_string(err)) end
  local self = setmetatable({
    p = ffi_gc(out[0], C.clientpool_fleet_close),
    _stats = ffi_new("clientpool_fleet_stats_t"), _lim = limits_t(),
    _ks = ffi_new("clientpool_fleet_key_stats_t"), _ms = ffi_new("clientpool_fleet_member_stats_t"),
    _reason = ffi_new("char[?]", _M.REASON_MAX + 1), _until = ffi_new("double[1]"),
    _name = ffi_new("char[?]", _M.KEY_MAX),
  }, fleet_mt)
  return self, rc == 1
end

function _M.remove(name)
  name = check_str(name, 1, "remove")
  local err = errbuf_t()
  local rc = C.clientpool_fleet_remove(name, #name, err, 320)
  if rc < 0 then return fail(rc, ffi_string(err)) end
  return true
end

function _M.shm_name(name)
  name = check_str(name, 1, "shm_name")
  local buf = namebuf_t()
  local n = C.clientpool_fleet_shm_name(name, #name, buf, 96)
  if n < 0 then return fail(n) end
  return ffi_string(buf, n)
end

function _M.strerror(code)
  code = check_int(code, 1, "strerror")
  return ffi_string(C.clientpool_fleet_strerror(code)), code < 0 and (ERR[code] or "unknown") or "ok"
end

-- ---- methods

function Fleet:close()
  local p = self.p
  if p == nil then return end
  ffi_gc(p, nil)
  C.clientpool_fleet_close(p)
  self.p = nil
  setmetatable(self, closed_mt)
end

function Fleet:join() return status(C.clientpool_fleet_join(self.p)) end
function Fleet:leave() return status(C.clientpool_fleet_leave(self.p)) end
function Fleet:detach() C.clientpool_fleet_detach(self.p) end
function Fleet:row() return C.clientpool_fleet_row(self.p) end

local function slot(s)
  if s < 0 then return fail(s) end
  return s
end

function Fleet:key_open(k)
  k = check_str(k, 2, "key_open")
  return slot(C.clientpool_fleet_key_open(self.p, k, #k))
end

function Fleet:key_find(k)
  k = check_str(k, 2, "key_find")
  return slot(C.clientpool_fleet_key_find(self.p, k, #k))
end

function Fleet:key_cap(k, cap)
  k = check_str(k, 2, "key_cap")
  cap = check_int(cap, 3, "key_cap")
  return slot(C.clientpool_fleet_key_cap(self.p, k, #k, cap < 0 and -1 or cap))
end

function Fleet:key_close(s)
  return status(C.clientpool_fleet_key_close(self.p, check_int(s, 2, "key_close")))
end

function Fleet:take(kind, key)
  return C.clientpool_fleet_take(self.p, kind, key or -1)
end

function Fleet:give(kind, key)
  return C.clientpool_fleet_give(self.p, kind, key or -1)
end

function Fleet:demand(kind, key, n)
  return tonumber(C.clientpool_fleet_demand(self.p, check_int(kind, 2, "demand"), key or -1, check_int(n, 4, "demand")))
end

function Fleet:seq() return tonumber(C.clientpool_fleet_seq(self.p)) end
function Fleet:waiting() return C.clientpool_fleet_waiting(self.p) end
function Fleet:poll() return tonumber(C.clientpool_fleet_poll(self.p)) end
function Fleet:gates_gen() return tonumber(C.clientpool_fleet_gates_gen(self.p)) end
function Fleet:shed(key) return C.clientpool_fleet_shed(self.p, key or -1) end
function Fleet:scan(full) return C.clientpool_fleet_scan(self.p, full and 1 or 0) end

function Fleet:pause(reason, key, till)
  reason = check_str(reason, 2, "pause")
  if key ~= nil then key = check_str(key, 3, "pause") end
  till = check_int(till, 4, "pause", -1)
  return status(C.clientpool_fleet_pause(self.p, key, key and #key or 0, reason, #reason, till))
end

function Fleet:resume(key)
  if key ~= nil then key = check_str(key, 2, "resume") end
  return status(C.clientpool_fleet_resume(self.p, key, key and #key or 0))
end

function Fleet:set_valid(till)
  return status(C.clientpool_fleet_set_valid(self.p, check_int(till, 2, "set_valid")))
end
function Fleet:lapsed() return C.clientpool_fleet_lapsed(self.p) == 1 end
function Fleet:valid_until()
  local u = C.clientpool_fleet_valid_until(self.p)
  if u < 0 then return nil end
  return u
end

function Fleet:gate(s)
  local rc = C.clientpool_fleet_gate(self.p, s or -1, self._reason, _M.REASON_MAX + 1, self._until)
  if rc < 0 then return fail(rc) end
  if rc ~= 1 then return false end
  local u = self._until[0]
  return true, ffi_string(self._reason), u >= 0 and u or nil
end

local LIMIT_FIELDS = { "max_live", "max_idle", "min_idle", "max_concurrency", "key_max_live", "key_max_idle",
                       "max_keys", "members", "attempts" }

local function limits_table(l)
  local t = {}
  for i = 1, #LIMIT_FIELDS do t[LIMIT_FIELDS[i]] = l[LIMIT_FIELDS[i]] end
  return t
end

function Fleet:limits()
  C.clientpool_fleet_limits(self.p, self._lim)
  return limits_table(self._lim)
end

local STATS_INT = { "live", "idle", "leases", "refilling", "demand_live", "demand_lease", "waiting_members",
                    "pledged", "members", "keys", "rows", "keys_cap", "paused", "repair_pending" }
local STATS_U64 = { "seq", "gates_gen", "limits_gen" }
local STATS_DBL = { "reclaimed", "repairs", "repaired_units", "resets", "joins", "created" }

function Fleet:update(lim)
  local err = errbuf_t()
  local rc = C.clientpool_fleet_update(self.p, read_limits(lim, 2, "update"), err, 320)
  if rc < 0 then return fail(rc, ffi_string(err)) end
  return true
end

-- The agent's place (fleet.h): epoch, pid, age; claim, beat, guarded
-- update, release.
local agent_pid, agent_age = ffi.new("int32_t[1]"), ffi.new("double[1]")
function Fleet:agent()
  local e = C.clientpool_fleet_agent(self.p, agent_pid, agent_age)
  return tonumber(e), agent_pid[0], agent_age[0]
end
function Fleet:agent_claim(epoch, stale)
  return tonumber(C.clientpool_fleet_agent_claim(self.p, check_int(epoch, 2, "agent_claim"),
                                                 check_int(stale, 3, "agent_claim")))
end
function Fleet:agent_beat(epoch)
  return status(C.clientpool_fleet_agent_beat(self.p, check_int(epoch, 2, "agent_beat")))
end
function Fleet:agent_update(epoch, lim, till)
  local err = errbuf_t()
  local rc = C.clientpool_fleet_agent_update(self.p, check_int(epoch, 2, "agent_update"),
                                             lim ~= nil and read_limits(lim, 3, "agent_update") or nil,
                                             till == nil and 0 / 0 or check_int(till, 4, "agent_update"), err, 320)
  if rc < 0 then return fail(rc, ffi_string(err)) end
  return true
end
function Fleet:agent_release(epoch)
  return status(C.clientpool_fleet_agent_release(self.p, check_int(epoch, 2, "agent_release")))
end

function Fleet:count(kind, key) return C.clientpool_fleet_count(self.p, kind, key or -1) end

function Fleet:stats()
  local s = self._stats
  C.clientpool_fleet_stats(self.p, s)
  local t = { limits = limits_table(s.limits) }
  for i = 1, #STATS_INT do t[STATS_INT[i]] = s[STATS_INT[i]] end
  for i = 1, #STATS_U64 do t[STATS_U64[i]] = tonumber(s[STATS_U64[i]]) end
  for i = 1, #STATS_DBL do t[STATS_DBL[i]] = s[STATS_DBL[i]] end
  return t
end

local KEY_INT = { "live", "idle", "leases", "refilling", "demand_live", "refs", "paused" }

function Fleet:key_stats(s)
  s = check_int(s, 2, "key_stats")
  local ks = self._ks
  local rc = C.clientpool_fleet_key_stats(self.p, s, ks, self._name, _M.KEY_MAX)
  if rc < 0 then return fail(rc) end
  if rc == 0 then return nil end
  local t = {}
  for i = 1, #KEY_INT do t[KEY_INT[i]] = ks[KEY_INT[i]] end
  return ffi_string(self._name, ks.len), t
end

local MEMBER_INT = { "state", "pid", "alive", "self", "live", "idle", "leases", "refilling", "demand_live",
                     "demand_lease", "pledged", "keys" }

function Fleet:member_stats(r)
  r = check_int(r, 2, "member_stats")
  local ms = self._ms
  local rc = C.clientpool_fleet_member_stats(self.p, r, ms)
  if rc < 0 then return fail(rc) end
  if rc == 0 then return nil end
  local t = { start = ms.start, heartbeat_age = ms.heartbeat_age }
  for i = 1, #MEMBER_INT do t[MEMBER_INT[i]] = ms[MEMBER_INT[i]] end
  return t
end

return _M
