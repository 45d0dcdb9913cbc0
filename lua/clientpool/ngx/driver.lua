-- clientpool.ngx.driver: driver{}, the manager of lua-resty driver objects
-- (the presets are in clientpool.ngx.drivers): its adapter for
-- clientpool.ngx.manager, and the guard on a leased object's own
-- set_keepalive()/close(). Part of clientpool.ngx (the public API).
local ngx = ngx
local type, error, pairs, ipairs, tostring, pcall, require = type, error, pairs, ipairs, tostring, pcall, require
local rawget, rawset, getmetatable = rawget, rawset, getmetatable

local keys = require "clientpool.ngx.keys"
local new_manager = require("clientpool.ngx.manager").new_manager
local fail, secrets = keys.fail, keys.secrets

local worker_exiting = ngx.worker.exiting

local _M = {}

-- driver()'s own options (IDENTITY and COMMON aside).
local DRIVER = {
  preset = true, new = true, connect = true, connect_options = true, keepalive = true, close = true,
  reused = true,
}

-- Private fields a driver object gets when a caller is handed it (rawset:
-- resty.redis makes a command method of every name its __index is asked).
local F_STATE, F_WHY, F_KA, F_CLOSE = "__clientpool_state", "__clientpool_why", "__clientpool_ka",
                                       "__clientpool_close"

-- Whether obj has a method `name`, without asking its __index function
-- (resty.redis would make a Redis command of any name).
local function has_method(obj, name)
  if type(rawget(obj, name)) == "function" then return true end
  local mt = getmetatable(obj)
  local idx = type(mt) == "table" and rawget(mt, "__index")
  while type(idx) == "table" do
    if type(rawget(idx, name)) == "function" then return true end
    local m2 = getmetatable(idx)
    idx = type(m2) == "table" and rawget(m2, "__index")
  end
  return false
end

local function driver_adapter(o, ctx)
  local what, stats = ctx.what, ctx.stats
  local preset
  if o.preset ~= nil then
    if type(o.preset) ~= "string" then fail("%s: 'preset' must be a string, got %s", what, type(o.preset)) end
    preset = rawget(require("clientpool.ngx.drivers"), o.preset)
    if type(preset) ~= "function" then
      fail("%s: unknown preset '%s' (redis, mysql, http, pgmoon)", what, o.preset)
    end
  end
  preset = preset and preset(o, fail, what) or {}
  local new = o.new
  if new == nil then new = preset.new end
  if type(new) ~= "function" then
    fail("%s: 'new' must be the driver's constructor (a function), got %s", what, type(new))
  end
  local connect = o.connect or preset.connect
  if connect ~= nil and type(connect) ~= "function" then
    fail("%s: 'connect' must be a function(obj, c, copts), got %s", what, type(connect))
  end
  local reused = o.reused or preset.reused
  if reused ~= nil and type(reused) ~= "function" then
    fail("%s: 'reused' must be a function(obj), got %s", what, type(reused))
  end
  local KA, CLOSE = o.keepalive or preset.keepalive or "set_keepalive", o.close or preset.close or "close"
  if type(KA) ~= "string" then fail("%s: 'keepalive' must be a method name, got %s", what, type(KA)) end
  if type(CLOSE) ~= "string" then fail("%s: 'close' must be a method name, got %s", what, type(CLOSE)) end
  local extra = o.connect_options
  if extra ~= nil then
    if type(extra) ~= "table" then fail("%s: 'connect_options' must be a table, got %s", what, type(extra)) end
    for _, k in ipairs { "pool", "pool_size", "pool_name" } do
      if extra[k] ~= nil then
        fail("%s: connect_options.%s: clientpool names and sizes nginx's pool itself", what, k)
      end
    end
  end
  if not connect and (o.user ~= nil or o.password ~= nil or o.database ~= nil) and not preset.setup then
    fail("%s: user/password/database need a preset or a 'connect' function that uses them", what)
  end
  local ct, st, rt, idle_ms, pool_size = ctx.ct, ctx.st, ctx.rt, ctx.idle_ms, ctx.pool_size
  local new_args, setup, make_args = preset.new_args, preset.setup, preset.args
  local timeouts -- how this driver's objects take timeouts (found on the first object)

  local ad = { quit = preset.quit }

  function ad.prepare(e)
    local p = e.p
    if p.client_cert_id then
      return nil, "client certificates: give the driver's own option in connect_options (tcp{} takes them)"
    end
    local c = { host = p.host, port = p.port, ssl = p.ssl, server_name = p.server_name,
                ssl_verify = p.ssl_verify, user = p.user, database = p.database, parts = p.parts }
    if p.password_id then
      c.password = secrets[p.password_id]
      if c.password == nil then
        return nil, "unknown password id '" .. p.password_id .. "' (make the key with cpngx.key{...} in this process)"
      end
    end
    if preset.check then
      local ok, err = preset.check(c)
      if not ok then return nil, err end
    end
    -- the driver's options, then the pool's: copts is what connect gets
    local copts = {}
    if extra then for k, v in pairs(extra) do copts[k] = v end end
    copts.pool, copts.pool_size = e.name, pool_size
    if not make_args and p.ssl then
      -- lua-resty-redis's (0.28+) names, the common ones
      copts.ssl, copts.server_name, copts.ssl_verify = true, p.server_name, p.ssl_verify == true
    end
    e.c, e.copts, e.take = c, copts, { pool = e.name }
    if make_args then e.args = make_args(c, copts) end
    return true
  end

  local function find_timeouts(obj)
    if has_method(obj, "set_timeouts") then return "set_timeouts" end
    if has_method(obj, "set_timeout") then return "set_timeout" end
    if has_method(obj, "settimeout") then return "settimeout" end
    return false
  end

  function ad.open(e)
    local c, copts = e.c, e.copts
    local obj, err
    if new_args then obj, err = new(new_args(c, copts, e.args)) else obj, err = new() end
    if type(obj) ~= "table" then
      if obj == nil then return nil, "new(): " .. tostring(err) end
      return nil, "new() must return a driver object (a table), got " .. type(obj)
    end
    if timeouts == nil then
      -- the first object: its methods (never through __index functions,
      -- which make a resty.redis command of any name)
      for _, m in ipairs { KA, CLOSE } do
        if not has_method(obj, m) then return nil, "the driver object has no method '" .. m .. "'" end
      end
      if not connect and not has_method(obj, "connect") then return nil, "the driver object has no method 'connect'" end
      if not reused and not has_method(obj, "get_reused_times") then
        return nil, "the driver object has no method 'get_reused_times' (give reused = function(obj))"
      end
      timeouts = find_timeouts(obj)
    end
    if timeouts == "set_timeouts" then
      if ct or st or rt then obj:set_timeouts(ct, st, rt) end
    elseif timeouts and ct then
      obj[timeouts](obj, ct)
    end
    local ok
    if connect then
      ok, err = connect(obj, c, copts, e.args)
    elseif c.port then
      ok, err = obj:connect(c.host, c.port, copts)
    else
      ok, err = obj:connect(c.host, copts)
    end
    if not ok then
      -- a driver may fail after the TCP connect (a refused login)
      local close = obj[CLOSE]
      if type(close) == "function" then pcall(close, obj) end
      return nil, err
    end
    if timeouts and timeouts ~= "set_timeouts" and (rt or st) then obj[timeouts](obj, rt or st) end
    local n
    if reused then
      n, err = reused(obj)
    else
      n, err = obj:get_reused_times()
    end
    if type(n) ~= "number" then
      pcall(obj[CLOSE], obj)
      return nil, "get_reused_times: " .. tostring(err)
    end
    return obj, n
  end

  function ad.setup(obj, e)
    if not setup then return true end
    return setup(obj, e.c)
  end

  -- The driver's own methods (a guarded object has them in private fields).
  local function real(obj, name, field)
    local f = rawget(obj, field)
    if f then return f end
    f = obj[name]
    if type(f) ~= "function" then fail("%s: the driver object has no method '%s'", what, name) end
    return f
  end
  function ad.keepalive(obj, ms, n) return real(obj, KA, F_KA)(obj, ms, n) end
  function ad.close(obj) return real(obj, CLOSE, F_CLOSE)(obj) end

  -- Counts a habit; its first one is a line in the error log, naming the fix.
  local warned = {}
  local function habit(name, method, does)
    stats[name] = stats[name] + 1
    if warned[name] then return end
    warned[name] = true
    ngx.log(ngx.WARN, "clientpool.ngx: ", what, ": ", method, "() on a leased driver object ", does,
            " (logged once per pool)")
  end
  -- A leased object's set_keepalive() (a habit from the bare driver) parks
  -- it the pool's way at once (the pool's timeout and size, not the
  -- caller's): lease:release() then only books it. A refusal (subscribed
  -- state, a transaction, unread data) is returned as the driver says it;
  -- the connection stays with the lease and its release retires it.
  -- docs/decisions.md ("Drivers") says why this is not an error.
  local function habit_keepalive(obj)
    if rawget(obj, F_STATE) ~= "leased" then return 1 end  -- parked or released already
    habit("habit_keepalive", KA, "parks it through the pool; lease:release() is enough")
    if worker_exiting() then return 1 end     -- its release closes it
    local pok, ok, err = pcall(rawget(obj, F_KA), obj, idle_ms, pool_size)
    if not pok then ok, err = nil, ok end
    if ok == 1 or ok == true then
      rawset(obj, F_STATE, "parked")
      return 1
    end
    if ok then
      -- not parked, though the driver said ok (lua-resty-http: 2, "connection must be closed")
      rawset(obj, F_STATE, "closed")
      rawset(obj, F_WHY, KA .. "() closed the connection (" .. tostring(err) .. ")")
    end
    return ok, err
  end
  -- A leased object's close() closes the connection; its lease's release
  -- then retires the record (counted), with a line in the error log.
  local function habit_close(obj)
    if rawget(obj, F_STATE) ~= "leased" then return nil, "closed" end
    habit("habit_close", CLOSE, "closes the connection; lease:release(false) retires it the pool's way")
    rawset(obj, F_STATE, "closed")
    rawset(obj, F_WHY, "the connection was closed by " .. CLOSE .. "() before its lease was released")
    return rawget(obj, F_CLOSE)(obj)
  end
  stats.habit_keepalive, stats.habit_close = 0, 0

  function ad.adopt(obj)
    rawset(obj, F_KA, real(obj, KA, F_KA))
    rawset(obj, F_CLOSE, real(obj, CLOSE, F_CLOSE))
    rawset(obj, KA, habit_keepalive)
    rawset(obj, CLOSE, habit_close)
    rawset(obj, F_STATE, "leased")
  end
  function ad.state(obj)
    return rawget(obj, F_STATE), rawget(obj, F_WHY)
  end
  function ad.done(obj)
    if rawget(obj, F_STATE) then rawset(obj, F_STATE, "done") end
  end
  return ad
end

--- Returns the options table for clientpool.new and the manager, for a
-- lua-resty driver (lua-resty-redis, lua-resty-mysql, lua-resty-http,
-- pgmoon, or any of the same shape). lease.client is the connected driver
-- object of this request. Options: preset ("redis", "mysql", "http",
-- "pgmoon": the driver's connect signature, methods and login); new (the
-- driver's constructor; a preset finds its module); connect(obj, c, copts)
-- (how to connect; default obj:connect(host, port, copts)); connect_options
-- (the driver's own options, copied into every connect); keepalive, close
-- (method names; a number as keepalive is the pool's option); reused(obj) (default obj:get_reused_times()); tcp{}'s
-- identity options (user, database, password log in through a preset),
-- timeouts and quit/quit_timeout (the redis preset quits by default);
-- on_connect(obj, key), once per new connection, after the driver's own
-- handshake. Everything else is clientpool.new's.
function _M.driver(o)
  -- `keepalive`: a method name (a string) is the driver's set_keepalive; a
  -- number is the pool's keepalive (seconds), passed on
  local pool_keepalive
  if type(o) == "table" and type(o.keepalive) == "number" then
    pool_keepalive = o.keepalive
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    c.keepalive = nil
    o = c
  end
  local ok, opts, mgr = pcall(new_manager, o, "driver()", DRIVER, driver_adapter)
  if not ok then error(opts, 2) end
  opts.keepalive = pool_keepalive
  return opts, mgr
end

return _M
