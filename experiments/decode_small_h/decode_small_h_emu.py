# Lane-level emulation of the small-head decode kernel's fragment mappings
# (experiments/decode_small_h/src/kernel.cuh, K by bit moves): every shared-memory load, e4m3 ->
# bf16 bit move, scale and mma follows the kernel's index math and the PTX m16n8k16 fragment
# layouts, in float64; the result must equal a plain float64 attention on the dequantized rows
# (one token, 96 entries, some invalid). Checks the mappings on a machine without a GPU; not the
# hardware. Run: python3 experiments/decode_small_h/decode_small_h_emu.py SEED H   (H in 1..32)
import numpy as np, struct, sys

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)

def e4m3(b):
    s = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xF; m = b & 7
    if e == 0: return s * (m / 8) * 2.0 ** -6
    return s * (1 + m / 8) * 2.0 ** (e - 7)

def bf16_bits_to_f(h):
    return struct.unpack('<f', struct.pack('<I', (h & 0xffff) << 16))[0]

def f_to_bf16_bits(x):  # round to nearest even
    u = struct.unpack('<I', struct.pack('<f', np.float32(x)))[0]
    u += 0x7fff + ((u >> 16) & 1)
    return (u >> 16) & 0xffff

def prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xff for i in range(4)] + [(b >> (8 * i)) & 0xff for i in range(4)]
    r = 0
    for i in range(4):
        n = (sel >> (4 * i)) & 0xf
        byte = src[n & 7]
        if n & 8: byte = 0xff if byte & 0x80 else 0
        r |= byte << (8 * i)
    return r

def conv_bits(a, b, sel):
    r = ((prmt(a, b, sel) << 4) & 0xffffffff) & 0x87f087f0
    return (bf16_bits_to_f(r & 0xffff), bf16_bits_to_f(r >> 16))

# every byte: the bit moves give e4m3 * 2^-120
for x in range(256):
    if (x & 0x7f) == 0x7f: continue
    lo, hi = conv_bits(x | (x << 8), 0, 0x9180)
    assert lo == e4m3(x) * 2.0 ** -120 and hi == lo, (x, lo, e4m3(x))
print('bit moves: all 254 finite e4m3 codes exact (x 2^-120)')

ROW = 656
H = int(sys.argv[2]) if len(sys.argv) > 2 else 16
MT = 1 if H <= 16 else 2
NROWS = 96  # entries of one token (3 tiles of 32)
rows = np.zeros((NROWS, ROW), np.uint8)
codes = rng.integers(0, 256, (NROWS, 512), dtype=np.int64)
codes[(codes & 0x7f) == 0x7f] = 0x10
rows[:, :512] = codes
scales = rng.choice([2.0 ** -6, 2.0 ** -4, 0.37, 1.3e-2], (NROWS, 4)).astype(np.float32)
rows[:, 512:528] = scales.view(np.uint8).reshape(NROWS, 16)
rope = rng.standard_normal((NROWS, 64)).astype(np.float32)
rope_b = np.array([[f_to_bf16_bits(v) for v in r] for r in rope], np.uint16)
rows[:, 528:656] = rope_b.view(np.uint8).reshape(NROWS, 128)
valid = rng.random(NROWS) > 0.2
q = rng.standard_normal((H, 576)).astype(np.float32)
qb = np.array([[f_to_bf16_bits(v) for v in r] for r in q], np.uint16)
qf = np.vectorize(bf16_bits_to_f)(qb)
scale_log2 = 0.1352338 * 1.4426950408889634

# reference on the dequantized rows
deq = np.zeros((NROWS, 576))
for r in range(NROWS):
    for d in range(512): deq[r, d] = e4m3(int(rows[r, d])) * float(scales[r, d // 128])
    deq[r, 512:] = [bf16_bits_to_f(int(x)) for x in rope_b[r]]
s_ref = qf @ deq[valid].T * 0.1352338
m = s_ref.max(1, keepdims=True); p = np.exp(s_ref - m)
out_ref = (p @ deq[valid, :512]) / p.sum(1, keepdims=True)
lse_ref = np.log(p.sum(1)) + m[:, 0]

def word(r, off):  # 4 bytes of row r at byte off
    return int.from_bytes(bytes(rows[r, off:off + 4]), 'little')

def mma(A, B, C):
    """A[lane][4 regs][2 halves], B[lane][2 regs][2 halves], C[lane][4]: PTX m16n8k16 layouts."""
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8)); Cm = np.zeros((16, 8))
    for lane in range(32):
        g, q4 = lane >> 2, lane & 3
        for reg in range(4):
            row = g + 8 * (reg & 1); col0 = 2 * q4 + 8 * (reg >> 1)
            Am[row, col0], Am[row, col0 + 1] = A[lane][reg]
        for reg in range(2):
            k0 = 2 * q4 + 8 * reg
            Bm[k0, g], Bm[k0 + 1, g] = B[lane][reg]
        for i in range(4):
            Cm[g + 8 * (i >> 1), 2 * q4 + (i & 1)] = C[lane][i]
    D = Am @ Bm + Cm
    return [[D[(lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)] for i in range(4)] for lane in range(32)]

def pair_f(bits32):
    return (bf16_bits_to_f(bits32 & 0xffff), bf16_bits_to_f(bits32 >> 16))

# Per-head exponent: the head's largest |q| into [2^64, 2^65) (bit moves); RoPE times 2^(e - 120).
import math
qexp = [min(max(64 - math.frexp(float(np.abs(qf[h]).max()))[1] + 1, 0), 126) for h in range(H)]
def qpair(h, d, mul):
    if h >= H: return (0.0, 0.0)
    return (qf[h, d] * 2.0 ** qexp[h], qf[h, d + 1] * 2.0 ** qexp[h])

sigma = [0, 4, 1, 5, 2, 6, 3, 7]
O = {}
for w in range(8):
    for lane in range(32): O[(w, lane)] = [[[0.0] * 4 for e in range(8)] for mt in range(MT)]
m_run = [-np.inf] * (16 * MT); l_run = [0.0] * (16 * MT)
for tile in range(NROWS // 32):
    base = 32 * tile
    red = np.zeros((8, 16 * MT, 32))
    for w in range(8):
        acc = [[[[0.0] * 4 for lane in range(32)] for nt in range(4)] for mt in range(MT)]
        for nt in range(4):
            Bs = []
            for s in range(4):
                B = []
                for lane in range(32):
                    g, q4 = lane >> 2, lane & 3
                    r = base + 8 * nt + sigma[g]
                    wd = word(r, 64 * w + 16 * q4 + 4 * s)
                    B.append([conv_bits(wd, 0, 0x9180), conv_bits(wd, 0, 0xB3A2)])
                for mt in range(MT):
                    A = []
                    for lane in range(32):
                        g, q4 = lane >> 2, lane & 3
                        d0 = 64 * w + 16 * q4 + 4 * s
                        A.append([qpair(mt * 16 + g, d0, 2.0 ** 64), qpair(mt * 16 + g + 8, d0, 2.0 ** 64),
                                  qpair(mt * 16 + g, d0 + 2, 2.0 ** 64), qpair(mt * 16 + g + 8, d0 + 2, 2.0 ** 64)])
                    acc[mt][nt] = mma(A, B, acc[mt][nt])
        for nt in range(4):
            for lane in range(32):
                g, q4 = lane >> 2, lane & 3
                s0 = float(scales[base + 8 * nt + q4, w >> 1]); s1 = float(scales[base + 8 * nt + q4 + 4, w >> 1])
                for mt in range(MT):
                    a = acc[mt][nt][lane]
                    acc[mt][nt][lane] = [a[0] * s0, a[1] * s1, a[2] * s0, a[3] * s1]
        for nt in range(4):
            B = []
            for lane in range(32):
                g, q4 = lane >> 2, lane & 3
                r = base + 8 * nt + sigma[g]
                B.append([pair_f(word(r, 528 + 2 * (8 * w + 2 * q4))), (0.0, 0.0)])
            for mt in range(MT):
                A = []
                for lane in range(32):
                    g, q4 = lane >> 2, lane & 3
                    rp = lambda h: (0.0, 0.0) if h >= H else (qf[h, 512 + 8 * w + 2 * q4] * 2.0 ** (qexp[h] - 120), qf[h, 513 + 8 * w + 2 * q4] * 2.0 ** (qexp[h] - 120))
                    A.append([rp(mt * 16 + g), rp(mt * 16 + g + 8), (0.0, 0.0), (0.0, 0.0)])
                acc[mt][nt] = mma(A, B, acc[mt][nt])
        for mt in range(MT):
            for nt in range(4):
                for lane in range(32):
                    g, q4 = lane >> 2, lane & 3
                    a = acc[mt][nt][lane]
                    red[w, mt * 16 + g, 8 * nt + q4] = a[0]; red[w, mt * 16 + g, 8 * nt + q4 + 4] = a[1]
                    red[w, mt * 16 + g + 8, 8 * nt + q4] = a[2]; red[w, mt * 16 + g + 8, 8 * nt + q4 + 4] = a[3]
    # reducer
    P = np.zeros((4, 16 * MT, 32)); alpha = [1.0] * (16 * MT)
    for h in range(16 * MT):
        S = red[:, h, :].sum(0) * scale_log2 * 2.0 ** (120 - (qexp[h] if h < H else 64))
        ok = valid[base:base + 32]
        S = np.where(ok, S, -np.inf)
        m_new = max(m_run[h], S.max()); m_use = 0.0 if m_new == -np.inf else m_new
        al = 2.0 ** (m_run[h] - m_use); pr = np.where(ok, 2.0 ** (S - m_use), 0.0)
        l_run[h] = l_run[h] * al + pr.sum(); m_run[h] = m_new; alpha[h] = al
        for lt in range(4):
            P[lt, h] = np.where(ok, pr * 2.0 ** 56 * scales[base:base + 32, lt], 0.0)
    # P V
    for w in range(8):
        for lane in range(32):
            g = lane >> 2
            for mt in range(MT):
                for e in range(8):
                    o = O[(w, lane)][mt][e]
                    O[(w, lane)][mt][e] = [o[0] * alpha[mt * 16 + g], o[1] * alpha[mt * 16 + g], o[2] * alpha[mt * 16 + g + 8], o[3] * alpha[mt * 16 + g + 8]]
        for ks in range(2):
            Bs = {}
            for lane in range(32):
                g, q4 = lane >> 2, lane & 3
                r0 = base + ks * 16 + 2 * q4
                v = [(word(rr, 64 * w + 8 * g), word(rr, 64 * w + 8 * g + 4)) for rr in (r0, r0 + 1, r0 + 8, r0 + 9)]
                for e, sel in enumerate([0xC480, 0xD591, 0xE6A2, 0xF7B3] * 2):
                    wi = 0 if e < 4 else 1
                    Bs.setdefault(e, []).append([conv_bits(v[0][wi], v[1][wi], sel), conv_bits(v[2][wi], v[3][wi], sel)])
            for mt in range(MT):
                A = []
                for lane in range(32):
                    g, q4 = lane >> 2, lane & 3
                    Pw = P[w >> 1]; c = ks * 16 + 2 * q4
                    A.append([(Pw[mt * 16 + g, c], Pw[mt * 16 + g, c + 1]), (Pw[mt * 16 + g + 8, c], Pw[mt * 16 + g + 8, c + 1]),
                              (Pw[mt * 16 + g, c + 8], Pw[mt * 16 + g, c + 9]), (Pw[mt * 16 + g + 8, c + 8], Pw[mt * 16 + g + 8, c + 9])])
                for e in range(8):
                    C = [O[(w, lane)][mt][e] for lane in range(32)]
                    D = mma(A, Bs[e], C)
                    for lane in range(32): O[(w, lane)][mt][e] = D[lane]
# epilogue
out = np.full((H, 512), np.nan)
for w in range(8):
    for lane in range(32):
        g, q4 = lane >> 2, lane & 3
        for mt in range(MT):
            for half in range(2):
                h = mt * 16 + g + 8 * half
                if h >= H: continue
                inv = 2.0 ** 64 / l_run[h]
                d0 = 64 * w + 16 * q4
                for e in range(8):
                    out[h, d0 + e] = O[(w, lane)][mt][e][2 * half] * inv
                    out[h, d0 + 8 + e] = O[(w, lane)][mt][e][2 * half + 1] * inv
lse = np.array([(m_run[h] + np.log2(l_run[h])) * np.log(2) for h in range(H)])
err = np.linalg.norm(out - out_ref) / np.linalg.norm(out_ref)
print('H', H, 'rel L2', err, 'lse max abs', np.abs(lse - lse_ref).max())
assert err < 1e-9 and np.abs(lse - lse_ref).max() < 1e-9
