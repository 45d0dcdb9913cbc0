-- spec/doc_blocks.lua: the code block of a document marked with
-- <!-- spec:NAME ...--> on the line before its fence (any mode of
-- docs/testing.md), so specs run the examples of docs/*.md as written.
return function(path, mark)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  local want, code = "<!-- spec:" .. mark, nil
  local prev
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if code then
      if line:match("^```%s*$") then return table.concat(code, "\n") .. "\n" end
      code[#code + 1] = line
    elseif prev and (prev == want .. " -->" or prev:sub(1, #want + 1) == want .. " ") and line:match("^```") then
      code = {}
    end
    prev = line
  end
  error(path .. " has no block marked " .. want)
end
