-- scripts/busted_crumbs.lua - a busted output handler: plainTerminal's
-- output, and the name and place of the test under way written to the
-- file named by $BUSTED_CRUMB at each test's start. When the interpreter
-- dies inside a test (a crash prints no summary), scripts/busted-run.sh
-- prints that file: which test it was.
return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.plainTerminal"(options)
  local path = os.getenv("BUSTED_CRUMB")
  if path and path ~= "" then
    busted.subscribe({ "test", "start" }, function(element)
      local f = io.open(path, "w")
      if f then
        local trace = element.trace or {}
        f:write(handler.getFullName(element), " (", tostring(trace.short_src), ":",
                tostring(trace.currentline), ")\n")
        f:close()
      end
      return nil, true
    end)
  end
  return handler
end
