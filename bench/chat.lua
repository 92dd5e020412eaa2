-- wrk script for the proxy-overhead benchmark (bench/overhead.sh).
-- POSTs a ~1.2 KB non-streaming chat completion, rotating `Authorization: Bearer fg-bench-<i>`
-- over 16 tenant keys; requests are prebuilt once per thread so Lua costs nothing per request.
-- At the end prints one machine-readable line:
--   FG_RESULT rps=<n> p50_ms=<n> p90_ms=<n> p99_ms=<n> requests=<n> non2xx=<n> socket_errors=<n>

local keys = 16
local prebuilt = {}
local counter = 0

local filler = string.rep("The quick brown fox jumps over the lazy dog. ", 24)
local body = '{"model":"gpt-4o-mini","max_tokens":16,"messages":['
    .. '{"role":"system","content":"You are a terse benchmark assistant."},'
    .. '{"role":"user","content":"' .. filler .. '"}]}'

init = function(args)
    for i = 0, keys - 1 do
        prebuilt[i] = wrk.format("POST", nil, {
            ["Content-Type"] = "application/json",
            ["Authorization"] = "Bearer fg-bench-" .. i,
        }, body)
    end
    counter = math.random(0, keys - 1)
end

request = function()
    counter = (counter + 1) % keys
    return prebuilt[counter]
end

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "FG_RESULT rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f requests=%d non2xx=%d socket_errors=%d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
        summary.requests, e.status, e.connect + e.read + e.write + e.timeout))
end
