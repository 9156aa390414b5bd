#!/usr/bin/env python3
"""Bytes and server CPU per poll of `GET /experts/map` against peers measured in the same run
(`/health`: a bare HTTP answer; `/stats`: the JSON the map is kept out of), in alternating
rounds, on one keep-alive connection. Server CPU is the server process's utime + stime from
/proc (Linux) over N polls.

    python3 scripts/map_poll.py PORT SERVER_PID [N=4000] [ROUNDS=5]

It first sends three completions (token-id prompts) so the map has heat and resident tiers.
See benchmarks/RESULTS.md ("Expert map polls").
"""
import http.client, json, os, sys, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
tck = os.sysconf('SC_CLK_TCK')
def cpu():
    f = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
c = http.client.HTTPConnection('127.0.0.1', port)
def get(path):
    c.request('GET', path); r = c.getresponse(); b = r.read(); return r.status, len(b), r
# Warm the model's heat and tiers: a few completions from token ids.
for i in range(3):
    body = json.dumps({"model": "x", "prompt": list(range(10 + i, 40 + i)), "max_tokens": 16})
    c.request('POST', '/v1/completions', body, {'content-type': 'application/json'}); r = c.getresponse(); r.read()
st, size, _ = get('/experts/map'); assert st == 200
_, emap_size, _ = get('/experts/map?format=emap')
_, stats_size, _ = get('/stats')
# The seq for 304 polls.
c.request('GET', '/experts/map'); r = c.getresponse(); b = r.read(); seq = int.from_bytes(b[8:16], 'little')
paths = {'map': '/experts/map', 'map_304': f'/experts/map?since={seq}', 'emap': '/experts/map?format=emap',
         'stats': '/stats', 'health': '/health'}
res = {k: [] for k in paths}
for rd in range(rounds):
    for k, p in paths.items():
        c0, t0 = cpu(), time.perf_counter()
        for _ in range(n):
            s, l, _ = get(p)
        c1, t1 = cpu(), time.perf_counter()
        res[k].append(((c1 - c0) / n * 1e6, (t1 - t0) / n * 1e6, l, s))
out = {}
for k, v in res.items():
    cpus = sorted(x[0] for x in v); walls = sorted(x[1] for x in v)
    out[k] = {'bytes': v[0][2], 'status': v[0][3], 'cpu_us_median': cpus[len(cpus)//2], 'cpu_us_all': [round(x, 1) for x in cpus], 'wall_us_median': round(walls[len(walls)//2], 1)}
print(json.dumps({'map_bytes': size, 'emap_bytes': emap_size, 'stats_bytes': stats_size, 'n': n, 'rounds': rounds, 'results': out}, indent=1))
