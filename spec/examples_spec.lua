-- The examples run, and what they report holds together.

describe("examples", function()
  describe("game_loop.lua", function()
    -- Runs the example as a chunk: its options come in as `...`, its summary
    -- comes back (it prints nothing with quiet = true).
    local function play(opts)
      local chunk = assert(loadfile("examples/game_loop.lua"))
      return chunk(opts)
    end

    it("runs a short game: NPC scripts share 4 pooled connections through the tick loop's adapter", function()
      local r = play { frames = 120, quiet = true }
      assert.is_table(r)
      assert.is_true(r.frames >= 120, "frames " .. tostring(r.frames))
      assert.equal(r.frames / 60, r.game_seconds)
      -- calls were made, and served by few connections
      assert.is_true(r.ok > 0)
      assert.equal(r.calls, r.ok + r.failed)
      assert.is_true(r.opened <= r.failed + r.max_live, "opened " .. r.opened .. " with " .. r.failed .. " retired")
      assert.is_true(r.opened < r.calls / 2, r.opened .. " connections for " .. r.calls .. " calls")
      -- 24 scripts, 4 connections: some waited, in the loop's frames
      assert.is_true(r.wait_count > 0)
      assert.is_true(r.max_waiting > 0)
      assert.is_true(r.wait_time > 0)
      -- everything given back and closed at the end
      assert.equal(0, r.leases)
      assert.equal(0, r.live)
      assert.equal(r.opened, r.closed)
    end)

    it("is deterministic: the same game twice gives the same summary", function()
      local a = play { frames = 90, quiet = true }
      local b = play { frames = 90, quiet = true }
      assert.same(a, b)
    end)

    it("ends the game on time with fewer scripts and frames", function()
      local r = play { frames = 30, npcs = 3, quiet = true }
      assert.equal(3, r.npcs)
      assert.is_true(r.frames >= 30 and r.frames < 30 + 10 * 60, "frames " .. r.frames)
      assert.equal(0, r.leases)
      assert.equal(r.opened, r.closed)
    end)
  end)
end)
