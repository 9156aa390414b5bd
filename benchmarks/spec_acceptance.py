#!/usr/bin/env python3
# Per-draft MTP acceptance on the demo model: seeded requests (coupled verification) against
# unseeded ones (rejection sampling), --mtp on, temperatures 0.7 and 1.0, every reference prompt,
# 128 tokens each. Usage: benchmarks/spec_acceptance.py GAMMAS SEEDS   (e.g. 1,3 8)
import json, pathlib, subprocess, sys
root = str(pathlib.Path(__file__).resolve().parent.parent)
ps = [p['input_ids'] for p in json.load(open(f'{root}/models/nectar-demo-glm5/reference.json'))['prompts']]
gammas = [int(g) for g in sys.argv[1].split(',')]
seeds = range(1, int(sys.argv[2]) + 1)
for g in gammas:
  for T in ['0.7', '1.0']:
    for mode in ['coupled', 'rejection']:
      d = a = 0; depth_c = [0]*g; depth_a = [0]*g
      for pi, p in enumerate(ps):
        for s in seeds:
          cmd = [f'{root}/target/release/nectar', 'run', '--json', '--no-usage-save', '--mtp', 'on', '--draft-tokens', str(g),
                 '--temperature', T, '--max-tokens', '128', '--prompt-ids', ','.join(map(str, p))]
          if mode == 'coupled':
            cmd += ['--seed', str(s)]
          v = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)['stats']['mtp']
          d += v['drafted']; a += v['accepted']
          for k in range(g):
            depth_c[k] += v['checked_by_depth'][k]; depth_a[k] += round(v['acceptance_by_depth'][k] * v['checked_by_depth'][k])
      print(f'gamma {g} T {T} {mode}: accepted {a}/{d} = {a/d:.4f}; by depth ' + ', '.join(f'{x}/{c}={x/max(c,1):.3f}' for x, c in zip(depth_a, depth_c)), flush=True)
