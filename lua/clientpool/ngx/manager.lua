-- clientpool.ngx.manager: the manager tcp{} and driver{} share: the pool's
-- hooks (create, destroy, park, unpark, keepalive_check) around an adapter,
-- nginx's keepalive pool names and sizes, parked records and stand-ins, the
-- managers' stats. Part of clientpool.ngx (the public API).
local ngx = ngx
local type, error, pairs, ipairs, tostring, pcall, setmetatable =
      type, error, pairs, ipairs, tostring, pcall, setmetatable
local math_floor, math_huge = math.floor, math.huge
local string_find = string.find

local keys = require "clientpool.ngx.keys"
local fail, check_params, encode, parse = keys.fail, keys.check_params, keys.encode, keys.parse

local get_phase = ngx.get_phase
local ngx_tcp = ngx.socket.tcp
local worker_exiting = ngx.worker.exiting

local _M = {}

-- Phases with cosockets.
local COSOCKET = {
  rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true,
}

---------------------------------------------------------------------------
-- Parked connections and stand-ins
---------------------------------------------------------------------------

--- What an idle record keeps: the connection itself is in nginx's pool.
local PARKED = setmetatable({}, { __tostring = function() return "clientpool.ngx.PARKED" end })
_M.PARKED = PARKED
-- What a record keeps once a keepalive check found its connection gone
-- from nginx's pool (or closed it): its destroy has nothing to take back.
local GONE = setmetatable({}, { __tostring = function() return "clientpool.ngx.GONE" end })

-- lease.client when a parked connection is granted in a phase without
-- cosockets (log, header_filter, body_filter, set, ...): the connection stays
-- parked, every method raises, release puts the record back as it was.
local STANDIN_MT = {
  __index = function(_, name)
    return function()
      error("clientpool.ngx: '" .. tostring(name) .. "' on a connection granted in the " ..
            tostring(get_phase()) .. " phase: cosockets are disabled there (release the lease)", 2)
    end
  end,
  __tostring = function() return "clientpool.ngx.STANDIN" end,
}
local STANDIN = setmetatable({}, STANDIN_MT)
_M.STANDIN = STANDIN

---------------------------------------------------------------------------
-- The manager: hooks around an adapter
---------------------------------------------------------------------------
--
-- tcp{} and driver{} are one manager. What differs is the adapter `ad`:
--   ad.open(e)                 a connection for entry e, connected with
--                              e.copts ({ pool = name, ... }): obj, reused
--                              (getreusedtimes) or nil, err
--   ad.setup(obj, e)           a new connection (reused == 0): TLS for tcp,
--                              a preset's AUTH/SELECT for a driver; true or
--                              nil, err
--   ad.keepalive(obj, ms, n)   parks it in nginx's pool: 1 (or true) when
--                              parked; anything else means it was not
--   ad.close(obj)
--   ad.raw                     true when obj is the cosocket itself (tcp{})
--   ad.quit                    the default of option quit (a driver preset's)
--   ad.prepare(e)              optional: completes a new entry (a driver's
--                              connect parameters); nil, err refuses the key
--   ad.adopt(obj), ad.state(obj), ad.done(obj)   optional (drivers): guard
--                              the object a caller gets, its state at park
--                              ("parked", "closed" + why), finished

-- The identity of the default key (cpngx.key's parameters) and the options
-- every manager takes; everything else goes to clientpool.new.
local IDENTITY = {
  host = true, port = true, ssl = true, server_name = true, ssl_verify = true,
  client_cert = true, client_priv_key = true, client_cert_id = true,
  user = true, database = true, password = true, parts = true,
}
local COMMON = { connect_timeout = true, send_timeout = true, read_timeout = true, on_connect = true,
                 quit = true, quit_timeout = true }
local HOOKS = { "create", "destroy", "park", "unpark", "keepalive_check" }

local managers = setmetatable({}, { __mode = "k" }) -- options table -> manager
local nmanagers = 0

-- A timeout in ms. nginx's settimeouts takes 1 .. 2^31-1 ms (0 would mean
-- its 60 s default, more raises where the socket is used): said now.
local function check_timeout(o, name, what)
  local v = o[name]
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math_huge then
    fail("%s: '%s' must be a finite number of seconds > 0, got %s", what, name, tostring(v))
  end
  local ms = math_floor(v * 1000 + 0.5)
  if ms < 1 or ms > 2147483647 then
    fail("%s: '%s' must be from 0.001 to 2147483.647 seconds (nginx's range), got %s", what, name, tostring(v))
  end
  return ms
end

-- Returns the options table for clientpool.new and the manager. `own`: the
-- names of the caller's own options (kept out of clientpool.new's);
-- make_adapter(o, ctx) returns the adapter (ctx: what, ct, st, rt in ms,
-- idle_ms, pool_size, stats, fail).
local function new_manager(o, what, own, make_adapter)
  if type(o) ~= "table" then fail("%s expects an options table, got %s", what, type(o)) end
  for _, h in ipairs(HOOKS) do
    if o[h] ~= nil then fail("%s fills in '%s' itself (use on_connect or validate)", what, h) end
  end
  local opts = {}
  for k, v in pairs(o) do
    if not IDENTITY[k] and not COMMON[k] and not own[k] then opts[k] = v end
  end
  local ct, st, rt = check_timeout(o, "connect_timeout", what), check_timeout(o, "send_timeout", what),
                     check_timeout(o, "read_timeout", what)
  local on_connect = o.on_connect
  if on_connect ~= nil and type(on_connect) ~= "function" then
    fail("%s: 'on_connect' must be a function, got %s", what, type(on_connect))
  end
  local default
  if o.host ~= nil then
    default = check_params(o, what)
  else
    for k in pairs(IDENTITY) do
      if o[k] ~= nil then
        fail("%s: '%s' without 'host' (give the identity in cpngx.key{...} instead)", what, k)
      end
    end
  end

  -- setkeepalive(timeout, size): the pool's idle_timeout and max_idle. With
  -- a warm floor (min_idle > 0) 0: nginx never times a parked connection
  -- out, since the pool spares the ones its floor needs from idle_timeout
  -- and retires the others itself (destroy takes one back and closes it)
  local idle_ms
  if type(o.min_idle) == "number" and o.min_idle > 0 then
    idle_ms = 0
  elseif type(o.idle_timeout) == "number" and o.idle_timeout > 0 and o.idle_timeout < math_huge then
    idle_ms = math_floor(o.idle_timeout * 1000 + 0.5)
  end
  -- nginx's pool for a key must hold every connection the key can have
  -- parked: max_idle idle records, plus records already handed to waiters
  -- that have not picked theirs up yet. Sized max_live (per key if capped):
  -- smaller, nginx closed the oldest under load and the pool counted them
  -- lost; the pool's own max_idle still bounds what stays idle.
  local pool_size = (type(o.per_key) == "table" and o.per_key.max_live) or o.max_live
  if pool_size == nil and type(o.fleet) == "string" then
    -- a pool on a fleet: max_live defaults to the fleet's (docs/fleet.md)
    -- (the configured figures: a Redis fleet's local cap is its current share)
    local lim = require("clientpool.fleet")._limits(o.fleet)
    pool_size = lim and (lim.key_max_live >= 0 and lim.key_max_live or lim.max_live)
  end
  if type(pool_size) ~= "number" or pool_size < 1 then pool_size = 1 end
  pool_size = math_floor(pool_size)

  nmanagers = nmanagers + 1
  local prefix = "clientpool#" .. nmanagers .. "#"

  local stats = {
    connects = 0,       -- new connections opened (create or unpark)
    reuses = 0,         -- connections taken from nginx's keepalive pool
    lost = 0,           -- unpark found its parked connection gone and opened a new one
    set_aside = 0,      -- parked connections create found, set aside and parked again
    parked = 0,         -- connections handed to nginx's keepalive pool
    park_failed = 0,    -- setkeepalive failed or was refused (the connection was closed)
    closed = 0,         -- connections closed by destroy
    closed_parked = 0,  -- parked connections taken back and closed by destroy
    closed_exiting = 0, -- released connections closed because the worker is exiting
    handshakes = 0,     -- TLS handshakes (tcp{}; a driver does its own)
    connect_failed = 0,
    keepalive_lost = 0, -- keepalive checks that found an idle record's connection gone from nginx's pool
    quit = 0,           -- closes the peer confirmed (option quit: it closed its end first)
    quit_unconfirmed = 0, -- ... that it did not confirm within the bound (closed anyway)
  }
  local mgr = { stats = stats, prefix = prefix }
  local ad = make_adapter(o, { what = what, ct = ct, st = st, rt = rt, idle_ms = idle_ms,
                               pool_size = pool_size, stats = stats })
  local ad_state, ad_done, ad_adopt = ad.state, ad.done, ad.adopt

  -- Option quit: what to send the peer before a close, so that destroy
  -- returns once the peer has closed its end (docs/decisions.md, "The
  -- upstream's count"): until then the upstream still counts the
  -- connection, and so does the pool. A driver preset may set a default
  -- (redis: QUIT); false turns it off.
  local quit = o.quit
  if quit == nil then quit = ad.quit end
  if quit == false then
    quit = nil
  elseif quit ~= nil and (type(quit) ~= "string" or quit == "") then
    fail("%s: 'quit' must be the bytes to send before a close (a non-empty string) or false, got %s",
         what, type(quit) == "string" and "an empty string" or type(quit))
  end
  -- how long a close waits for the peer's. Short by default: in a request
  -- the caller of release(false) waits too, often because the peer was
  -- slow already; past it the close goes on (counted quit_unconfirmed)
  local quit_ms = check_timeout(o, "quit_timeout", what) or 100
  if o.quit_timeout ~= nil and not quit then
    fail("%s: 'quit_timeout' without 'quit' (the bytes that make the peer close)", what)
  end

  -- key -> { p = params, name, copts = connect options, take = { pool = name } },
  -- reset when it grows large
  local cache, ncache = {}, 0
  local function new_entry(p, key)
    local name = prefix .. key
    local copts = { pool = name, pool_size = pool_size }
    local e = { p = p, name = name, copts = copts, take = copts }
    if ad.prepare then
      local ok, err = ad.prepare(e)
      if not ok then return nil, "clientpool.ngx: " .. what .. ": " .. tostring(err) end
    end
    return e
  end
  local function entry(key)
    local e = cache[key or false]
    if e then return e end
    local p, err
    if key == nil then
      p = default
      if not p then return nil, "clientpool.ngx: no host given to " .. what .. ": acquire by cpngx.key{...}" end
      e, err = new_entry(p, encode(p))
      if e then cache[false] = e end
      return e, err
    end
    p, err = parse(key)
    if not p then return nil, err end
    e, err = new_entry(p, key)
    if not e then return nil, err end
    if ncache >= 1024 then
      local d = cache[false]
      cache, ncache = { [false] = d }, 0
    end
    ncache = ncache + 1
    cache[key] = e
    return e
  end
  if default then
    -- a default identity the adapter refuses is a bad option, said now
    local e, err = entry(nil)
    if not e then error(err, 0) end
  end

  --- The nginx keepalive pool name of a key (nil = the default key).
  function mgr.name(key)
    local e, err = entry(key)
    if not e then return nil, err end
    return e.name
  end

  --- The key of an identity (cpngx.key's parameters).
  mgr.key = keys.key

  -- A connected object for entry e and its reused count, or nil, err.
  local function open(e)
    local obj, reused = ad.open(e)
    if not obj then
      stats.connect_failed = stats.connect_failed + 1
      local p = e.p
      return nil, "connect to " .. p.host .. (p.port and (":" .. p.port) or "") .. ": " .. tostring(reused)
    end
    return obj, reused
  end

  -- Creates of a key may hold its parked connections aside at once (one
  -- per request or timer): e.asides counts them, e.aside_until is the
  -- latest of their deadlines (the connect timeout, and a little). While
  -- any holds some, an unpark or a take-back of the key waits (aside_wait)
  -- rather than find nginx's pool short of the connections the pool
  -- counts; never past that deadline. A create killed meanwhile (ngx.exit,
  -- a kill) never ends its set-aside (nginx closes what it held with its
  -- request): past the deadline the count starts again.
  -- e.owed: take-backs that found nothing while set-asides were held past
  -- their deadline (a slow driver login, a DNS lookup): the creates holding
  -- them close that many instead of parking them again.
  local function aside_held(e)
    return e.aside_until ~= nil and ngx.now() < e.aside_until
  end
  local function aside_begin(e)
    local t = ngx.now() + (ct or 1000) / 1000 + 0.1
    if not aside_held(e) then e.asides, e.owed = 0, nil end
    e.asides = e.asides + 1
    if not e.aside_until or t > e.aside_until then e.aside_until = t end
  end
  local function aside_end(e)
    e.asides = (e.asides or 1) - 1
    if e.asides <= 0 then e.asides, e.aside_until, e.owed = nil, nil, nil end
  end
  local function aside_wait(e)
    while aside_held(e) do
      ngx.sleep(0.001)
      ngx.update_time()
    end
  end

  -- Closes a cosocket; with quit, sends it first and reads (discarding
  -- late replies) until the peer closes, within quit_ms. Where nothing can
  -- yield (no cosockets) it just closes.
  local function close_sock(sock)
    if quit and COSOCKET[get_phase()] then
      sock:settimeouts(quit_ms, quit_ms, quit_ms)
      -- (a socket already closed, by its caller or the peer, is not quit)
      if sock:send(quit) then
        local confirmed = false
        ngx.update_time()
        local deadline = ngx.now() + quit_ms / 1000
        repeat
          local data, err = sock:receiveany(65536)
          if not data then
            -- the peer let go (closed, or reset); anything else ("timeout",
            -- "socket busy reading": another thread's read) is no answer
            confirmed = err == "closed" or string_find(tostring(err), "reset", 1, true) ~= nil
            break
          end
          ngx.update_time()
          local left = deadline - ngx.now()
          if left <= 0 then break end
          sock:settimeouts(quit_ms, quit_ms, math_floor(left * 1000) + 1)
        until false
        if confirmed then stats.quit = stats.quit + 1 else stats.quit_unconfirmed = stats.quit_unconfirmed + 1 end
      end
    end
    return sock:close()
  end

  -- Closes a connection a create set aside (owed to a take-back): the quit
  -- way for a cosocket, the driver's close for a driver object.
  local function close_conn(obj)
    if ad.raw then return close_sock(obj) end
    return ad.close(obj)
  end

  -- Parks a connection of no record again (set aside by create, below).
  local function repark(obj)
    local pok, ok = pcall(ad.keepalive, obj, idle_ms, pool_size)
    if not pok or (ok ~= 1 and ok ~= true) then
      pcall(ad.close, obj)
      stats.park_failed = stats.park_failed + 1
    end
  end

  -- Connects for key; returns obj, reused count, or nil, err. With fresh
  -- (create), a parked connection is never taken: it belongs to an idle
  -- record (the warm floor creates while idle records are parked). Each one
  -- found is set aside until a new connection is open, then parked again.
  local function connect(key, fresh)
    local phase = get_phase()
    if not COSOCKET[phase] then
      return nil, "clientpool.ngx: cannot connect in the " .. phase .. " phase (cosockets are disabled there)"
    end
    local e, err = entry(key)
    if not e then return nil, err end
    if not fresh and e.aside_until then
      -- an unpark while a create of this key holds parked connections aside
      -- (below): wait for them rather than open one more connection than
      -- the pool counts (the field test first: every reuse passes here)
      aside_wait(e)
    end
    local obj, reused = open(e)
    if not obj then return nil, reused end
    if fresh and reused > 0 then
      -- nginx keeps at most pool_size parked connections per name. While
      -- they are set aside (the fresh connect below yields), an unpark of
      -- this key waits for them (e.aside_until) instead of opening one more.
      local aside, n = {}, 0
      aside_begin(e)
      -- (protected: a driver's connect may raise, and what is set aside
      -- must go back and the set-aside end either way)
      local pok, perr = pcall(function()
        repeat
          n = n + 1
          aside[n] = obj
          obj, reused = open(e)
        until not obj or reused == 0 or n > pool_size
      end)
      for i = 1, n do
        if (e.owed or 0) > 0 then
          e.owed = e.owed - 1
          pcall(close_conn, aside[i])
          stats.closed_parked = stats.closed_parked + 1
        else
          repark(aside[i])
        end
      end
      aside_end(e)
      if not pok then error(perr, 0) end
      stats.set_aside = stats.set_aside + n
      if not obj then return nil, reused end
    end
    if reused > 0 then
      stats.reuses = stats.reuses + 1
      return obj, reused
    end
    stats.connects = stats.connects + 1
    local ok
    ok, err = ad.setup(obj, e)
    if not ok then
      pcall(ad.close, obj)
      return nil, err
    end
    if on_connect then
      local okc, r1, r2 = pcall(on_connect, obj, key)
      if not okc or not r1 then
        pcall(ad.close, obj)
        return nil, "on_connect: " .. tostring(okc and r2 or r1)
      end
    end
    return obj, 0
  end

  function opts.create(key)
    local obj, err = connect(key, true)
    if not obj then return nil, err end
    if ad_adopt then ad_adopt(obj) end
    return obj
  end

  function opts.unpark(stored, key) -- luacheck: ignore stored
    if not COSOCKET[get_phase()] then return STANDIN end
    local obj, reused = connect(key)
    if not obj then return nil, reused end
    -- the parked connection was closed (idle timeout, peer): a new one
    if reused == 0 then stats.lost = stats.lost + 1 end
    if ad_adopt then ad_adopt(obj) end
    return obj
  end

  function opts.park(obj, key)
    if obj == STANDIN then return PARKED end
    if ad_state then
      local state, why = ad_state(obj)
      if state == "parked" then
        -- the caller's own set_keepalive() parked it the pool's way already
        ad_done(obj)
        stats.parked = stats.parked + 1
        return PARKED
      elseif state == "closed" then
        ad_done(obj)
        error("clientpool.ngx: " .. tostring(why) ..
              ": the record is retired (lease:release(false) retires a connection without this message)", 0)
      end
    end
    if worker_exiting() then
      stats.closed_exiting = stats.closed_exiting + 1
      -- (a cosocket with quit is left to the destroy that retires the
      -- record, which quits it: park must not yield)
      if not (quit and ad.raw) then
        pcall(ad.close, obj)
        if ad_done then ad_done(obj) end
      end
      error("clientpool.ngx: worker exiting: connection closed instead of parked", 0)
    end
    local e, err = entry(key)
    local ok
    if e then
      -- pgmoon raises ("connection is busy") where the others return nil, err
      local pok
      pok, ok, err = pcall(ad.keepalive, obj, idle_ms, pool_size)
      if not pok then ok, err = nil, ok end
    end
    if ad_done then ad_done(obj) end
    if ok ~= 1 and ok ~= true then
      pcall(ad.close, obj)
      stats.park_failed = stats.park_failed + 1
      if ad_state then
        error("clientpool.ngx: " .. what .. ": the driver did not park the connection (" .. tostring(err) ..
              "): closed and retired", 0)
      end
      error("clientpool.ngx: setkeepalive failed: " .. tostring(err) ..
            " (a cosocket is closed when the handler that made it ends: release in that handler)", 0)
    end
    stats.parked = stats.parked + 1
    return PARKED
  end

  -- Takes one parked connection of key back from nginx's pool and closes
  -- it: a connect to "unix:" with pool = name returns a pooled connection if
  -- there is one and fails at once, without any I/O, if there is none.
  -- `live`: the connection was a leased one, parked here only to be closed
  -- the quit way (counted closed, not closed_parked).
  local function take_back(key, live)
    if not COSOCKET[get_phase()] then return end
    local e = entry(key)
    if not e then return end
    -- a create of this key holds parked connections aside: wait for them.
    -- Finding none, this destroy would free the room while the one it
    -- stands for is parked again later, open and counted nowhere
    aside_wait(e)
    local sock = ngx_tcp()
    local ok = sock:connect("unix:", e.take)
    if ok then
      close_sock(sock)
      if live then stats.closed = stats.closed + 1 else stats.closed_parked = stats.closed_parked + 1 end
    elseif (e.asides or 0) > 0 then
      -- still set aside past its deadline: its create closes one for us
      e.owed = (e.owed or 0) + 1
    end
  end

  function opts.destroy(client, key)
    if client == PARKED or client == STANDIN then return take_back(key) end
    if client == nil or client == GONE then return end
    if ad_state then
      local state = ad_state(client)
      ad_done(client)
      if state == "parked" then return take_back(key) end   -- its set_keepalive() parked it
      if state == "closed" or state == "done" then return end
    end
    if quit and COSOCKET[get_phase()] then
      if ad.raw then
        local ok, r = pcall(close_sock, client)
        if not ok then ok, r = pcall(client.close, client) end
        if ok and r then stats.closed = stats.closed + 1 end
        return
      end
      -- a driver object: parked and taken back at once (no I/O, no yield
      -- between), its socket is ours to quit. A driver that refuses to park
      -- it (unread data, a transaction), or an exiting worker (whose
      -- setkeepalive closes), gets a plain close below.
      if not worker_exiting() then
        local pok, parked = pcall(ad.keepalive, client, idle_ms, pool_size)
        if pok and (parked == 1 or parked == true) then return take_back(key, true) end
      end
    end
    -- another handler's socket raises "bad request": nginx closes it when
    -- that handler ends
    local ok, r = pcall(ad.close, client)
    if ok and r then stats.closed = stats.closed + 1 end
  end

  -- The pool's keepalive (option keepalive = s) checks an idle record in a
  -- timer (cosockets work there). Its connection is in nginx's pool under
  -- the key's name, which nginx keeps clean: it closes a parked connection
  -- whose peer closed it or that passed its keepalive timeout. So the check
  -- takes every connection parked there (a connect with the pool's name
  -- and no address returns a parked one at once, without I/O, or fails),
  -- parks them again in the same order, and compares: fewer than the key's
  -- idle records (`idle`, from the pool; connections this manager holds
  -- out for a check counted in) means one is gone, and this record goes
  -- (GONE: its destroy takes nothing back). With the pool's validate, one
  -- connection is then taken and validated too (a round trip, which also
  -- keeps middleboxes from dropping idle connections), and parked again.
  local validate = o.validate
  function opts.keepalive_check(stored, key, idle_s, idle)
    if stored ~= PARKED or not COSOCKET[get_phase()] then return true end
    local e = entry(key)
    -- a create holds parked connections aside meanwhile (connect): the count would be short
    if not e or aside_held(e) then return true end
    local socks, n = {}, 0
    while n <= idle do
      local sock = ngx_tcp()
      if not sock:connect("unix:", e.take) then break end
      n = n + 1
      socks[n] = sock
    end
    for i = n, 1, -1 do
      local ok = socks[i]:setkeepalive(idle_ms, pool_size)
      if not ok then pcall(socks[i].close, socks[i]); n = n - 1 end
    end
    if n + (e.checking or 0) < idle then
      stats.keepalive_lost = stats.keepalive_lost + 1
      return false, GONE
    end
    if not validate then return true end
    local obj = opts.unpark(stored, key)
    if obj == nil then return false end          -- (nothing taken: destroy takes one back)
    e.checking = (e.checking or 0) + 1
    local ok, good = pcall(validate, obj, key, idle_s)
    e.checking = e.checking - 1
    if ok and good and pcall(opts.park, obj, key) then return true end
    -- (a failed park closed it already, except a cosocket with quit in an
    -- exiting worker, which it leaves to destroy: harmless on a closed one)
    opts.destroy(obj, key)
    return false, GONE
  end

  managers[opts] = mgr
  return opts, mgr
end

_M.new_manager = new_manager

--- The manager of an options table made by tcp() or driver() (its stats and names).
function _M.manager(opts)
  return managers[opts]
end

--- The counters of an options table made by tcp() or driver().
function _M.stats(opts)
  local m = managers[opts]
  return m and m.stats
end

return _M
