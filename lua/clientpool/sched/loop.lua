-- Scheduler adapter "loop": the built-in scheduler's default instance
-- (clientpool.loop), looked up by name as clientpool.sched.loop.
return require "clientpool.loop"
