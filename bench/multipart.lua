-- wrk script: POST image files as multipart/form-data, one file per request, and print the
-- results as one JSON line.
--
--   wrk -t1 -c16 -d20s --timeout 60s -s bench/multipart.lua http://127.0.0.1:8000/v1/models/m/classify \
--       -- image a.jpg b.jpg ...
--
-- Arguments after `--`: the multipart field name, then the files. Each connection's requests
-- cycle through the files; each wrk thread starts at a different file so threads do not post
-- the same image in lockstep. Bodies are built once in init(), not per request.

local requests = {}
local counter = 0

local function read_file(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. path)
  local data = f:read("*a")
  f:close()
  return data
end

local thread_index = 0

function setup(thread)
  thread:set("index", thread_index)
  thread_index = thread_index + 1
end

function init(args)
  local field = args[1]
  local boundary = "----patchserve-bench-7c1e0f5a"
  local headers = { ["Content-Type"] = "multipart/form-data; boundary=" .. boundary }
  for i = 2, #args do
    local path = args[i]
    local name = path:match("([^/]+)$")
    local body = "--" .. boundary .. "\r\n"
      .. 'Content-Disposition: form-data; name="' .. field .. '"; filename="' .. name .. '"\r\n'
      .. "Content-Type: image/jpeg\r\n\r\n"
      .. read_file(path) .. "\r\n"
      .. "--" .. boundary .. "--\r\n"
    requests[#requests + 1] = wrk.format("POST", nil, headers, body)
  end
  counter = (index or 0) * 7
end

function request()
  counter = counter + 1
  return requests[(counter % #requests) + 1]
end

function done(summary, latency, requests_stats)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"min": %d, "mean": %.1f, "stdev": %.1f, "max": %d, "p50": %d, "p90": %d, "p99": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
