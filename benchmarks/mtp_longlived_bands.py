"""Medians per round band of `benchmarks/mtp_longlived.sh`'s JSON lines: per round, `auto`'s tok/s
and busy-time tokens per second over `off`'s in the same round, and `auto`'s drafts per step.
usage: mtp_longlived_bands.py OUT.jsonl   (prints Markdown rows: parallel, rounds, off tok/s,
auto tok/s, auto ÷ off, busy ÷ off, drafts per step; past 30 rounds also 31–N and 16–N)"""
import json, sys, statistics as S
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
prev={}
by={}
for r in rows:
    key=(r['parallel'],r['mtp'])
    st=r['stats']; ld=r['load']['levels'][0]
    tok=ld.get('completion_tokens') or ld.get('tokens')
    tps=ld.get('tok_s') or ld.get('aggregate_tok_s')
    p=prev.get(key,{'busy':0,'drafted':0,'steps':0})
    busy=st['busy_seconds']-p['busy']; dr=st['drafted']-p['drafted']; steps=(st['steps'] or 0)-p['steps']
    prev[key]={'busy':st['busy_seconds'],'drafted':st['drafted'],'steps':st['steps'] or 0}
    by[(r['parallel'],r['round'],r['mtp'])]=(tps, tok/busy if busy>0 else float('nan'), dr/max(steps,1))
levels=sorted({k[0] for k in by}); rounds=sorted({k[1] for k in by})
for p in levels:
    longer=[(31,max(rounds)),(16,max(rounds))] if max(rounds)>30 else []
    for lo,hi in [(1,5),(6,15),(16,30)]+longer:
        rs=[r for r in rounds if lo<=r<=hi and (p,r,'off') in by and (p,r,'auto') in by]
        if not rs: continue
        t=S.median(by[(p,r,'auto')][0]/by[(p,r,'off')][0] for r in rs)
        b=S.median(by[(p,r,'auto')][1]/by[(p,r,'off')][1] for r in rs)
        d=S.median(by[(p,r,'auto')][2] for r in rs)
        to=S.median(by[(p,r,'off')][0] for r in rs); ta=S.median(by[(p,r,'auto')][0] for r in rs)
        print(f"| {p} | {lo}–{hi} | {to:.0f} | {ta:.0f} | **{t:.2f}** | {b:.2f} | {d:.2f} |")
