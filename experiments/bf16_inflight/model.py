#!/usr/bin/env python3
"""Paper model of h64.ws's bf16 pipeline per SM: two release points per buffer (today) against one per 64-dim block.

docs/perf-history.md#s12-bf16-inflight. A 2-cycle time-stepped model of one block's steady state (240 tiles):
- the tensor pipe runs wgmma groups one at a time in the order they are issued (S per half or per block, P.V0 of the
  scorer, P.V1 of consumer 1), with durations sigma / pi already slowed by the gather (s7 ubench ratios);
- the scorer: S(t) -> mu cycles of softmax -> P.V0(t) -> delta (P stores, bar_p) -> LT (the landed test) -> S(t + 1)
  behind P.V0(t) if tile t + 1 has landed, else P.V0's release first (score_loop);
- consumer 1: bar_p(t) + eps -> P.V1(t) -> release;
- the producer refills in order as blocks are released (ws_produce), taking prod_issue cycles per tile to issue;
- the gather: 'fifo' = rows served in issue order at one tile per TB cycles, landing L0 later (calibrated on the
  ubench: one tile in flight R = L0 + TB, two in flight one tile per TB; s7 run 13's 4931 / 4407 cycles, scaled to
  the case's one-in-flight time P1), or 'ps' = a delay Z then processor sharing at one tile per Sg.
Prints the period per tile (cycles), the tiles in flight, consumer 1's P.V wait and the scorer's row wait (shares of
the period) for both modes. Usage: python3 model.py [fifo|ps] [landed-test cycles, default 100]. ~45 s.
Not a measurement: every input is a figure of docs/perf-history.md; it exists to show how the answer moves with them.
"""
import sys
GATHER = sys.argv[1] if len(sys.argv) > 1 else 'fifo'
LT = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
def sim(mode, mu, P1=4166.0, sig=1560.6, pi=762.6, delta=150, eps=60, prod_issue=300, ntiles=240, dt=2.0,
        zfrac=1048/4931, extra=0):
    Z = zfrac * P1; Sg = P1 - Z
    TB = P1 * 4407 / 4931; L0 = P1 - TB
    if mode == 'today':
        portions = [(0, [0,1,2,3]), (1, [4,5,6,7,8])]
    else:
        portions = [(j, [j]) for j in (8,0,1,2,3,4,5,6,7)]
    blk_bytes = [1/9.0]*9
    # releases: rel[(tile, blk)] = time released (all readers done)
    # per-portion readiness for refill: all blocks of portion released by tile t-2
    land = {}      # (tile, blk) -> time landed
    rel = {}
    # gather state
    inflight = []  # [tile, pid, blocks, t_issue, remaining_demand]
    # producer state
    prod_queue = [(t, pid, blks) for t in range(ntiles) for (pid, blks) in portions]
    pq = 0; prod_busy_until = 0.0
    # tensor pipe FIFO: list of [dur, tag]; done times recorded
    tq = []; tdone = {}; tcur = None; tcur_end = 0.0
    # scorer / consumer program counters implemented as generators
    t = 0.0
    def landed(tile, blks): return all((tile, b) in land and land[(tile, b)] <= t for b in blks)
    def done(tag): return tag in tdone and tdone[tag] <= t
    if mode == 'today':
        sgroups = [[0,1,2,3],[4,5,6,7,8]]
    else:
        sgroups = [[k] for k in range(9)]
    ev = {}
    def scorer():
        # yields conditions (callables) to wait on, and performs actions
        tile = 0
        # issue S(0)
        for gi, g in enumerate(sgroups):
            yield lambda g=g: landed(0, g)
            tq.append([sig*len(g)/9.0 + (extra/len(sgroups)), ('S', 0, gi)])
        for tile in range(ntiles):
            yield lambda tile=tile: done(('S', tile, len(sgroups)-1))
            ev.setdefault('sdone', []).append(t)
            # S done with half 1 (today) / every block's S read (per block: block 8 released after S)
            if mode == 'today':
                rel_part(tile, 'S1')
            else:
                rel_part(tile, 'S8')
            tnext = t + mu
            yield lambda tn=tnext: t >= tn
            npv = 1 if mode == 'today' else 4
            for k in range(npv): tq.append([pi/npv, ('PV0', tile, k)])
            tn2 = t + delta
            yield lambda tn=tn2: t >= tn
            ev[('barp', tile)] = t
            if tile + 1 >= ntiles:
                for k in range(npv):
                    yield lambda k=k, tile=tile: done(('PV0', tile, k))
                    rel_part(tile, ('PV0', k))
                break
            allblk = list(range(9))
            tn3 = t + LT
            yield lambda tn=tn3: t >= tn
            if landed(tile+1, allblk):
                for gi, g in enumerate(sgroups): tq.append([sig*len(g)/9.0 + (extra/len(sgroups)), ('S', tile+1, gi)])
                for k in range(npv):
                    yield lambda k=k, tile=tile: done(('PV0', tile, k))
                    rel_part(tile, ('PV0', k))
            else:
                for k in range(npv):
                    yield lambda k=k, tile=tile: done(('PV0', tile, k))
                    rel_part(tile, ('PV0', k))
                for gi, g in enumerate(sgroups):
                    t_w = t
                    yield lambda g=g, tile=tile: landed(tile+1, g)
                    if 40 <= tile < ntiles - 10: ev['rowwait'] = ev.get('rowwait', 0.0) + (t - t_w)
                    tq.append([sig*len(g)/9.0 + (extra/len(sgroups)), ('S', tile+1, gi)])
    def consumer1():
        for tile in range(ntiles):
            yield lambda tile=tile: ('barp', tile) in ev and t >= ev[('barp', tile)] + eps
            npv = 1 if mode == 'today' else 4
            for k in range(npv): tq.append([pi/npv, ('PV1', tile, k)])
            t_iss = t
            for k in range(npv):
                yield lambda k=k, tile=tile: done(('PV1', tile, k))
                rel_part(tile, ('PV1', k))
            if 40 <= tile < ntiles - 10: ev['c1wait'] = ev.get('c1wait', 0.0) + (t - t_iss)
    # which blocks each release event frees (both readers accounted)
    relstate = {}
    def rel_part(tile, what):
        if mode == 'today':
            if what == 'S1': relstate[(tile,'S1')] = t
            if what == ('PV0', 0):
                for b in (0,1,2,3): rel[(tile,b)] = t
            if what == ('PV1', 0):
                for b in (4,5,6,7,8): rel[(tile,b)] = max(t, relstate.get((tile,'S1'), t))
        else:
            if what == 'S8': rel[(tile,8)] = t
            if what[0] == 'PV0': rel[(tile, what[1])] = t
            if what[0] == 'PV1': rel[(tile, 4 + what[1])] = t
    progs = [scorer(), consumer1()]
    conds = [next(p) for p in progs]
    inflight_area = 0.0
    while True:
        # tensor pipe
        if tcur is not None and t >= tcur_end:
            tdone[tcur] = t; tcur = None
        if tcur is None and tq:
            dur, tag = tq.pop(0); tcur = tag; tcur_end = t + dur
        # programs
        progressed = True
        while progressed:
            progressed = False
            for i, p in enumerate(progs):
                if conds[i] is None: continue
                if conds[i]():
                    try: conds[i] = p.send(None)
                    except StopIteration: conds[i] = None
                    progressed = True
            if tcur is None and tq:
                dur, tag = tq.pop(0); tcur = tag; tcur_end = t + dur
        # producer
        while pq < len(prod_queue) and t >= prod_busy_until:
            tile, pid, blks = prod_queue[pq]
            if tile >= 2 and not all((tile-2, b) in rel and rel[(tile-2, b)] <= t for b in blks): break
            inflight.append([tile, pid, blks, t + (Z if GATHER != 'fifo' else 0), sum(blk_bytes[b] for b in blks)])
            prod_busy_until = t + prod_issue * len(blks) / 9.0
            pq += 1
        # gather: delay then processor sharing
        if GATHER == 'fifo':
            budget = dt / TB
            for f in inflight:
                if f[4] <= 0 or budget <= 0: continue
                use = min(budget, f[4]); f[4] -= use; budget -= use
                if f[4] <= 0: f.append(t + L0)
            landed_now = [f for f in inflight if len(f) > 5 and t >= f[5]]
        else:
            serving = [f for f in inflight if t >= f[3]]
            if serving:
                share = dt / Sg / len(serving)
                for f in serving: f[4] -= share
            landed_now = [f for f in inflight if f[4] <= 0]
        for f in landed_now:
            for b in f[2]: land[(f[0], b)] = t
            inflight.remove(f)
        inflight_area += sum(sum(blk_bytes[b] for b in f[2]) for f in inflight) * dt
        if all(c is None for c in conds): break
        t += dt
        if t > 1e7: raise SystemExit('stuck')
    sd = ev['sdone']; a, b = 40, ntiles - 10
    per = (sd[b] - sd[a]) / (b - a)
    return per, inflight_area / t, ev.get('c1wait', 0) / (b - a) / per, ev.get('rowwait', 0) / (b - a) / per
if __name__ == '__main__':
    for P1, lab in ((4166, 'H128'), (4733, 'H64')):
        for mu in (800, 1000, 1200):
            r0 = sim('today', mu, P1); r1 = sim('blocks', mu, P1); r2 = sim('blocks', mu, P1, extra=100)
            print(f"{lab} mu={mu}: today P={r0[0]:.0f} N={r0[1]:.2f} c1wait={r0[2]:.2f} rows={r0[3]:.2f} | blocks P={r1[0]:.0f} c1={r1[2]:.2f} rows={r1[3]:.2f} ({100*(r1[0]/r0[0]-1):+.1f} %) | +100 waits {r2[0]:.0f} ({100*(r2[0]/r0[0]-1):+.1f} %)")
