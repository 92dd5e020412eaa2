-- wrk script of bench/rig.sh. Arguments (after `--`): BODIES STREAM
--   BODIES: identical (one prebuilt body), unique (a new body every request: defeats the
--           token-count cache), prefix (agent-shaped: a long conversation shared by every
--           request, a new last message each time)
--   STREAM: true | false (a chat stream without stream_options, as the SDKs send by default)
-- Rotates `Authorization: Bearer fg-bench-<i>` over 16 tenant keys. Prints one line at the end:
--   FG_RESULT rps=<n> p50_ms=<n> p90_ms=<n> p99_ms=<n> requests=<n> non2xx=<n> socket_errors=<n>

local keys = 16
local counter = 0
local kind = "identical"
local stream = "false"
local headers = {}
local prebuilt = {}
local head, tail

local filler = string.rep("The quick brown fox jumps over the lazy dog. ", 24)
local system = '{"role":"system","content":"You are a terse benchmark assistant."}'

-- An agent's conversation so far: a long system prompt, tool calls and their results.
local function history()
    local turns = { '{"role":"system","content":"You are a coding agent. '
        .. string.rep("Follow the repository conventions and explain each change. ", 30) .. '"}' }
    for i = 1, 6 do
        turns[#turns + 1] = '{"role":"user","content":"Step ' .. i .. ': ' .. filler .. '"}'
        turns[#turns + 1] = '{"role":"assistant","content":"Done with step ' .. i
            .. '. ' .. string.rep("Changed the handler and its test. ", 8) .. '"}'
    end
    return table.concat(turns, ",")
end

local function body(last)
    return head .. last .. tail
end

init = function(args)
    kind = args[1] or kind
    stream = args[2] or stream
    for i = 0, keys - 1 do
        headers[i] = {
            ["Content-Type"] = "application/json",
            ["Authorization"] = "Bearer fg-bench-" .. i,
        }
    end
    local msgs = (kind == "prefix") and (history() .. ",") or (system .. ",")
    head = '{"model":"gpt-4o-mini","max_tokens":256,"stream":' .. stream .. ',"messages":['
        .. msgs .. '{"role":"user","content":"'
    tail = '"}]}'
    if kind == "identical" then
        for i = 0, keys - 1 do
            prebuilt[i] = wrk.format("POST", nil, headers[i], body(filler))
        end
    end
    counter = math.random(0, 1000000000)
end

request = function()
    counter = counter + 1
    local k = counter % keys
    if kind == "identical" then
        return prebuilt[k]
    elseif kind == "unique" then
        return wrk.format("POST", nil, headers[k], body("Request " .. counter .. ". " .. filler))
    else
        return wrk.format("POST", nil, headers[k], body("Step 7 (" .. counter .. "): now run the tests."))
    end
end

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "FG_RESULT rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f requests=%d non2xx=%d socket_errors=%d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
        summary.requests, e.status, e.connect + e.read + e.write + e.timeout))
end
