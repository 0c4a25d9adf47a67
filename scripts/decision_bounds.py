#!/usr/bin/env python3
"""How much any simple rule could reclaim on a trace, tuned with hindsight (standard library).

    python3 scripts/decision_bounds.py TRACE.om.gz [--threshold 0.05] [--horizon 2h] [--max-regret 0.10]

An analysis for docs/decision-quality.md, not a decision path: it answers "is a target such
as ≥ 70 GPU-hours at ≤ 10 % regret within reach of any rule on this trace?" by trying whole
families of rules and keeping the best member of each, chosen after the fact (hindsight: the
parameters are tuned on the very spans they are scored on, which no causal estimate can do).
If the best hindsight-tuned rule of a family stays below a target, every causal estimate
that uses only that family's information stays below it too.

It reads the trace's GPU activity per pod (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, else
`DCGM_FI_DEV_GPU_UTIL` / 100), one-minute buckets as `backtest` does: a bucket is busy if a
sample is at or above the threshold, idle if all are below, unobserved without samples. A
pod's idle span runs from the first idle bucket after busy to the next busy bucket
(resumed) or to its last sample (gone: reclaimed to there, never a regret). An action at
`a` reclaims until the span ends and is a regret if it resumed within the horizon of `a`.
There is no warning notice, no startup grace and no maxPerHour: these rows are about *when*
to act. Its "act after X" rows are printed beside for calibration against `backtest
--sweep` (they agree within a few GPU-hours: the ladder's notice and coverage rules differ).

Families (each member acts on a span at the first minute its condition holds):
- fixed: act after T;
- oracle: act 30 minutes into exactly the spans that do not resume within the horizon;
- time of day: act after T1 if the span began in [h1, h2) UTC (a half-hour grid), else T2;
- own traffic: act after T1 if the pod was busy at most x of the W before the span, else T2;
- fleet quiet: act after T1 if the whole fleet was busy at most f of the W before, else T2;
- time of day and own traffic together.

With `--causal` (about 2 more minutes) it also replays a causal estimate pooled by what the
families above found most telling, to see whether an estimator could learn it on the trace
itself: the product-limit risk of the pooled spans seen so far (each span observed up to
the current minute, a span still open censored there; the span's own pod's current span
left out), against the cautious prior (100 % over 4 cases), needing 10 cases, acting at
the first minute from 1h the risk is at most the level, else at maxIdle (8h, 4h). Pools:
every span; by the quarter of the day a span began (as the product does); by whether its
pod was busy at most 5 % of the 6 h before; both.
"""

import argparse
import gzip
import itertools
import re
import sys

LINE = re.compile(r'^(\w+)\{(.*)\} (\S+) (\d+)')
POD = re.compile(r'(?:^|,)(?:exported_)?pod="([^"]*)"')


def duration(text):
    units = {"s": 1, "m": 60, "h": 3600}
    total, number = 0, ""
    for c in text:
        if c.isdigit():
            number += c
        elif c in units and number:
            total += int(number) * units[c]
            number = ""
        else:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 2h or 90m")
    if number:
        raise argparse.ArgumentTypeError(f"{text!r} needs a unit (s, m or h), e.g. 2h")
    return total // 60


def read(path, threshold):
    """Per pod: a list over one-minute buckets of True (busy), False (idle) or None."""
    engine, util = {}, {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            m = LINE.match(line)
            if not m or m.group(1) not in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"):
                continue
            pod = POD.search(m.group(2))
            if not pod or not pod.group(1) or "dcgm-exporter" in pod.group(1):
                continue
            value = float(m.group(3))
            if m.group(1) == "DCGM_FI_DEV_GPU_UTIL":
                value /= 100.0
            target = engine if m.group(1).startswith("DCGM_FI_PROF") else util
            bucket = int(m.group(4)) // 60
            cell = target.setdefault(pod.group(1), {})
            cell[bucket] = max(cell.get(bucket, 0.0), value)
    series = {p: engine.get(p) or util[p] for p in set(engine) | set(util)}
    if not series:
        sys.exit(f"decision_bounds: {path} holds no DCGM activity series with a pod label")
    first = min(min(s) for s in series.values())
    last = max(max(s) for s in series.values())
    busy = {}
    for pod, s in series.items():
        row = [None] * (last - first + 1)
        for b, v in s.items():
            row[b - first] = v >= threshold
        busy[pod] = row
    return busy, first


def spans(row):
    """(start, end, resumed) of each idle span; a span still idle at the pod's last sample
    ends there, not resumed (the pod went away or the trace ended)."""
    observed = [i for i, x in enumerate(row) if x is not None]
    if not observed:
        return []
    last = observed[-1] + 1
    out, start = [], None
    for i, x in enumerate(row[:last]):
        if x is True:
            if start is not None:
                out.append((start, i, True))
            start = None
        elif x is False and start is None:
            start = i
    if start is not None:
        out.append((start, last, False))
    return out


def score(acts, horizon):
    """acts: (action minute, span end, resumed). → (actions, regrets, GPU-hours)."""
    regrets = sum(1 for a, e, resumed in acts if resumed and e - a <= horizon)
    return len(acts), regrets, sum(e - a for a, e, _ in acts) / 60.0


def rule(all_spans, horizon, t1, t2, passes):
    """Act `t1` into spans where `passes(pod, start)`, else `t2` into them."""
    acts = []
    for pod, (s, e, resumed) in all_spans:
        t = t1 if passes(pod, s) else t2
        if s + t < e:
            acts.append((s + t, e, resumed))
    return score(acts, horizon)


def best(results, max_regret):
    ok = [r for r in results if r[0][0] and r[0][1] / r[0][0] <= max_regret]
    return max(ok, key=lambda r: r[0][2]) if ok else None


def causal(all_spans, horizon, level, max_idle, key, after=60, min_spans=10, prior=4.0):
    """Act on each span at the first minute from `after` where the pooled product-limit
    risk (spans of the same `key` seen up to that minute) with the prior is at most `level`,
    else at `max_idle`."""
    pool = [x for x in all_spans if x[1][1] - x[1][0] > after]
    acts = []
    for pod, (s, e, resumed) in all_spans:
        if e - s <= after:
            continue
        k, acted = key(pod, s), None
        for t in range(after, min(max_idle, e - s)):
            now, ends, at_risk = s + t, [], 0
            for q, (s2, e2, r2) in pool:
                if s2 >= now or (q == pod and s2 == s) or key(q, s2) != k:
                    continue
                seen = min(e2, now) - s2
                if seen > t:
                    at_risk += 1
                    ends.append((seen - t, r2 and e2 <= now))
            if at_risk < min_spans:
                continue
            ends.sort()
            left, survival = at_risk, 1.0
            for u, group in itertools.groupby(ends, key=lambda x: x[0]):
                if u > horizon:
                    break
                group = list(group)
                resumed_here = sum(1 for _, r in group if r)
                if left > 0:
                    survival *= 1 - resumed_here / left
                left -= len(group)
            risk = (at_risk * (1 - survival) + prior) / (at_risk + prior)
            if risk <= level:
                acted = now
                break
        if acted is None and e - s > max_idle:
            acted = s + max_idle
        if acted is not None:
            acts.append((acted, e, resumed))
    return score(acts, horizon)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--threshold", type=float, default=0.05, help="idle.threshold (0-1)")
    ap.add_argument("--horizon", type=duration, default=120, help="the regret horizon")
    ap.add_argument("--max-regret", type=float, default=0.10)
    ap.add_argument("--causal", action="store_true", help="also replay causal pooled estimates")
    args = ap.parse_args()
    busy, first = read(args.trace, args.threshold)
    pods = sorted(busy)
    all_spans = [(p, s) for p in pods for s in spans(busy[p])]
    h = args.horizon
    hod = lambda i: ((first + i) % 1440) / 60.0  # noqa: E731 (UTC hour of a bucket)

    def cumulative(values):
        out = [0]
        for v in values:
            out.append(out[-1] + v)
        return out

    n = len(next(iter(busy.values())))
    busy_sum = {p: cumulative([1 if x else 0 for x in busy[p]]) for p in pods}
    seen_sum = {p: cumulative([0 if x is None else 1 for x in busy[p]]) for p in pods}
    fleet_busy = cumulative([sum(1 for p in pods if busy[p][i]) for i in range(n)])
    fleet_seen = cumulative([sum(1 for p in pods if busy[p][i] is not None) for i in range(n)])

    def share(b, s, end, window):
        a = max(0, end - window)
        seen = s[end] - s[a]
        return (b[end] - b[a]) / seen if seen else 1.0

    def row(name, r):
        actions, regrets, gpu_h = r
        rate = regrets / actions if actions else 0.0
        print(f"{name:<62} {actions:>7} {regrets:>7} {rate:>7.1%} {gpu_h:>9.1f}")

    print(f"{len(pods)} pods, {len(all_spans)} idle spans, {n / 60:.1f} h; regret horizon {h} min; "
          f"best of each family at <= {args.max_regret:.0%} regret, tuned in hindsight\n")
    print(f"{'rule':<62} {'actions':>7} {'regrets':>7} {'rate':>7} {'GPU-h':>9}")
    for t in (60, 90, 120, 180, 240, 360, 480):
        row(f"fixed: act after {t // 60}h{t % 60:02d}m", rule(all_spans, h, t, t, lambda p, s: True))
    oracle = [(s + 30, e, r) for _, (s, e, r) in all_spans if s + 30 < e and not (r and e - s - 30 <= h)]
    row("oracle: 30m into the spans that do not resume within the horizon", score(oracle, h))
    t2s = (240, 300, 360, 480)
    families = {}
    grid = [x / 2 for x in range(0, 48)]
    families["time of day"] = [
        (rule(all_spans, h, t1, t2, lambda p, s, a=a, b=b: a <= hod(s) < b), f"after {t1}m if began {a:g}-{b:g} UTC, else {t2}m")
        for t1 in (30, 45, 60, 75, 90, 120, 150) for a in grid for b in grid if b > a for t2 in t2s]
    families["own traffic"] = [
        (rule(all_spans, h, t1, t2, lambda p, s, x=x, w=w: share(busy_sum[p], seen_sum[p], s, w) <= x),
         f"after {t1}m if busy <= {x:.0%} of the {w}m before, else {t2}m")
        for t1 in (30, 45, 60, 75, 90, 120) for w in (60, 180, 360) for x in (0.01, 0.02, 0.03, 0.05, 0.08, 0.1)
        for t2 in t2s]
    families["fleet quiet"] = [
        (rule(all_spans, h, t1, t2, lambda p, s, f=f, w=w: share(fleet_busy, fleet_seen, s, w) <= f),
         f"after {t1}m if the fleet busy <= {f:.0%} of the {w}m before, else {t2}m")
        for t1 in (30, 45, 60, 75, 90, 120) for w in (30, 60, 120, 240) for f in (0.01, 0.02, 0.03, 0.05, 0.08, 0.1)
        for t2 in t2s]
    families["time of day and own traffic"] = [
        (rule(all_spans, h, t1, t2,
              lambda p, s, a=a, b=b, x=x: a <= hod(s) < b and share(busy_sum[p], seen_sum[p], s, 360) <= x),
         f"after {t1}m if began {a:g}-{b:g} UTC and busy <= {x:.0%} of the 6h before, else {t2}m")
        for t1 in (45, 60, 75, 90) for a in grid[24:] for b in grid[24:] if b > a
        for x in (0.03, 0.05, 0.08, 0.1, 0.15) for t2 in (240, 300)]
    for name, results in families.items():
        found = best(results, args.max_regret)
        if found:
            row(f"{name}: best of {len(results)}", found[0])
            print(f"    {found[1]}")
        else:
            print(f"{name}: no member at <= {args.max_regret:.0%} regret")
    if not args.causal:
        return
    quiet = lambda p, s: share(busy_sum[p], seen_sum[p], s, 360) <= 0.05  # noqa: E731
    quarter = lambda p, s: int(hod(s) // 6)  # noqa: E731
    pools = {
        "every span": lambda p, s: 0,
        "quarter of the day": quarter,
        "own traffic <= 5 % of 6h": quiet,
        "quarter and own traffic": lambda p, s: (quarter(p, s), quiet(p, s)),
    }
    print("\ncausal pooled estimate (prior 100 % over 4 cases, 10 cases): GPU-h at regret rate per level")
    for max_idle in (480, 240):
        for name, key in pools.items():
            cells = []
            for level in (0.05, 0.1, 0.2, 0.3, 0.5):
                actions, regrets, gpu_h = causal(all_spans, h, level, max_idle, key)
                cells.append(f"{level:.0%} {gpu_h:.1f} at {regrets / actions if actions else 0:.0%}")
            print(f"  maxIdle {max_idle // 60}h, {name:<26} " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
