#!/usr/bin/python3
"""PyTorch peer for ``gridsync-bench train --vs-torch``.

``gridsync-bench`` runs this script to compare our C++ hash-grid trainer with
a straightforward, reasonably efficient PyTorch (CPU) implementation of the
same model. It is meant for Debian's ``/usr/bin/python3`` with
``python3-torch`` (1.13) and ``numpy``; nothing else is needed.

Model and training (instant-ngp / tiny-cuda-nn image fitting)
-------------------------------------------------------------
* Image: ``--image-raw FILE --width W --height H``, raw little-endian float32,
  H rows x W columns x 3 channels (RGB in [0,1]), row-major, row 0 at the top.
* A position (u, v) lies in [0,1]^2; u runs along the width, v along the
  height (downwards). The target at (u, v) is the bilinear interpolation of
  the image, pixel (column i, row j) having its centre at
  ((i+0.5)/W, (j+0.5)/H), clamped to the edge.
* Each step draws ``--batch`` positions uniform in [0,1)^2 from torch's RNG
  (seeded with ``--seed``, which also seeds the parameter initialisation).
* Encoding: a 2D multiresolution hash grid. For level l (float32 math like
  tiny-cuda-nn) scale = exp2(l * log2(per_level_scale)) * base_resolution - 1
  and res = ceil(scale) + 1. With T = 2^log2_hashmap_size a level is dense
  when res*res <= T (size = res*res rounded up to a multiple of 8, index
  x + y*res) and hashed otherwise (size T, index
  ((x*1) XOR (y*2654435761)) mod 2^32). As in tiny-cuda-nn the index is then
  taken modulo the level size (this only matters for dense levels, whose
  top/right corner can step one past the grid and wraps). pos = u*scale + 0.5
  per dimension (dim 0 = u, dim 1 = v), grid = floor(pos), frac = pos - grid,
  and the 4 corners grid + {0,1}^2 are blended with the bilinear weights.
  All levels live in ONE parameter table (rows = sum of level sizes, columns =
  ``--n-features``) addressed through per-level offsets; the encoded vector is
  level-major [l0 f0, l0 f1, l1 f0, ...]. Initialisation U(-1e-4, 1e-4).
* MLP: n_levels*n_features -> ``--n-hidden-layers`` ReLU layers of
  ``--n-neurons`` -> 3 linear outputs, no biases, Xavier-uniform weights.
* Loss: MSE, mean over the batch and the 3 channels.
* Optimiser: the table is a sparse-gradient embedding updated by
  ``torch.optim.SparseAdam``; the MLP uses ``torch.optim.Adam``; both with
  betas (0.9, 0.99), eps 1e-15 and ``--lr``.
* Timing covers only the training loop (sampling, forward, backward,
  optimiser steps); evaluations requested with ``--eval-steps`` are excluded.
* Evaluation: every pixel centre, predictions clamped to [0,1], MSE over all
  pixels and channels, PSNR = -10*log10(MSE).

Output: progress on stderr; the last stdout line is one JSON object with
impl, torch_version, threads, steps, batch, seconds, samples_per_s,
final_loss, psnr and psnr_at (PSNR keyed by step, for --eval-steps).

Known semantic difference from gridsync
---------------------------------------
``torch.optim.SparseAdam`` applies Adam's bias correction with one global step
count (every step counts, whether or not a row was touched), while gridsync,
like tiny-cuda-nn, keeps a step count per table row and bias-corrects each
row with the number of updates that row actually received. Rarely touched rows
(fine hashed levels at small batches) therefore take slightly different steps
early in training; results agree closely but not bit for bit. Also, pos is
computed as a float32 multiply then add here, where tiny-cuda-nn uses a fused
multiply-add; this can move a sample across a cell edge in rare cases.

Exit codes: 0 success, 2 invalid arguments or input file.
"""

import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from peer_args import ArgParser, int_at_least, positive_float


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def die(msg):
    print("torch_hashgrid.py: error: " + msg, file=sys.stderr, flush=True)
    sys.exit(2)


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def step_list(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        out.append(positive_int(part))
    return sorted(set(out))


def parse_args(argv):
    p = ArgParser(description="PyTorch hash-grid image fitting peer for gridsync-bench train --vs-torch")
    p.add_argument("--image-raw", required=True, help="raw float32 LE image, H x W x 3, row-major")
    p.add_argument("--width", type=positive_int, required=True)
    p.add_argument("--height", type=positive_int, required=True)
    p.add_argument("--batch", type=positive_int, default=16384)
    p.add_argument("--steps", type=positive_int, default=1000)
    p.add_argument("--seed", type=non_negative_int, default=1337)
    p.add_argument("--n-levels", type=positive_int, default=16)
    p.add_argument("--n-features", type=positive_int, default=2)
    p.add_argument("--log2-hashmap-size", type=positive_int, default=19)
    p.add_argument("--base-resolution", type=positive_int, default=16)
    p.add_argument("--per-level-scale", type=positive_float, default=1.5)
    p.add_argument("--n-neurons", type=positive_int, default=64)
    p.add_argument("--n-hidden-layers", type=non_negative_int, default=2,
                   help="number of hidden ReLU layers (0 = a single linear layer)")
    p.add_argument("--lr", type=positive_float, default=1e-2)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--eval-steps", type=step_list, default=[],
                   help="comma-separated steps at which to also report PSNR, e.g. 100,500")
    p.add_argument("--log-every", type=non_negative_int, default=100,
                   help="progress line on stderr every N steps (0 = never)")
    p.add_argument("--eval-chunk", type=positive_int, default=65536)
    p.add_argument("--warmup-steps", type=non_negative_int, default=0,
                   help="also time the steps after these (steady_samples_per_s), as gridsync-bench "
                        "train times its own")
    # PyTorch DDP (gloo) across processes: the all-reduce baseline of
    # tools/emulate/bench-cluster.sh. The table's gradient is dense, as DDP
    # all-reduces it; both tables use torch.optim.Adam.
    p.add_argument("--ddp-rank", type=non_negative_int, default=None)
    p.add_argument("--ddp-world", type=positive_int, default=1)
    p.add_argument("--ddp-master", default=None, help="HOST:PORT of rank 0's TCP store")
    p.add_argument("--ddp-timeout", type=positive_float, default=60.0, help="seconds")
    p.add_argument("--target-psnr", type=positive_float, default=None,
                   help="stop once PSNR (checked every --eval-every steps) reaches this")
    p.add_argument("--eval-every", type=positive_int, default=10)
    a = p.parse_args(argv)
    if a.ddp_rank is not None and (a.ddp_master is None or a.ddp_rank >= a.ddp_world):
        die("--ddp-rank needs --ddp-master HOST:PORT and a rank below --ddp-world")
    if a.batch % a.ddp_world != 0:
        die("--batch %d does not split over --ddp-world %d" % (a.batch, a.ddp_world))
    if a.log2_hashmap_size > 30:
        die("--log2-hashmap-size must be in 1..30, got %d" % a.log2_hashmap_size)
    if a.n_levels > 64:
        die("--n-levels must be in 1..64, got %d" % a.n_levels)
    if not (a.per_level_scale >= 1.0):
        die("--per-level-scale must be >= 1, got %g" % a.per_level_scale)
    return a


def load_image(path, w, h):
    try:
        size = os.path.getsize(path)
    except OSError as e:
        die("cannot read --image-raw %s: %s" % (path, e.strerror or e))
    expected = w * h * 3 * 4
    if size != expected:
        die("--image-raw %s has %d bytes; expected W*H*3*4 = %d*%d*3*4 = %d"
            % (path, size, w, h, expected))
    arr = np.fromfile(path, dtype="<f4")
    if arr.size != w * h * 3:
        die("--image-raw %s: short read" % path)
    if not np.all(np.isfinite(arr)):
        die("--image-raw %s contains non-finite values" % path)
    return torch.from_numpy(arr.astype(np.float32).reshape(h, w, 3).copy())


class HashGrid(torch.nn.Module):
    """2D multiresolution hash encoding with one concatenated table."""

    PRIME_Y = 2654435761

    def __init__(self, n_levels, n_features, log2_T, base_res, per_level_scale, sparse=True):
        super().__init__()
        self.sparse = sparse
        T = 1 << log2_T
        log2_pls = np.log2(np.float32(per_level_scale))  # float32
        scales, ress, sizes, offsets, hashed = [], [], [], [], []
        offset = 0
        self.levels = []
        for l in range(n_levels):
            s = np.exp2(np.float32(l) * log2_pls) * np.float32(base_res) - np.float32(1.0)
            s = np.float32(s)
            if not (np.isfinite(s) and s < 2.0 ** 30):
                die("level %d grid scale %g is too large (must stay below 2^30); lower "
                    "--n-levels, --base-resolution or --per-level-scale" % (l, float(s)))
            res = int(math.ceil(float(s))) + 1
            if res * res <= T:
                size = (res * res + 7) // 8 * 8
                is_hashed = False
            else:
                size = T
                is_hashed = True
            scales.append(s)
            ress.append(res)
            sizes.append(size)
            offsets.append(offset)
            hashed.append(is_hashed)
            self.levels.append(dict(level=l, scale=float(s), res=res, size=size,
                                    offset=offset, hashed=is_hashed))
            offset += size
        self.n_levels = n_levels
        self.n_features = n_features
        self.n_params_rows = offset
        # Per-level constants. scale broadcasts against (N, L, 2); the index
        # constants are repeated per corner, shape (1, L*4), so that the integer
        # math runs on contiguous (N, L*4) tensors (level-major, corner-minor).
        self.register_buffer("scale", torch.tensor(np.array(scales, dtype=np.float32)).view(1, n_levels, 1))

        def per_corner(values, dtype):
            return torch.tensor(values, dtype=dtype).repeat_interleave(4).view(1, n_levels * 4)

        self.register_buffer("res", per_corner(ress, torch.int64))
        self.register_buffer("size", per_corner(sizes, torch.int64))
        self.register_buffer("offset", per_corner(offsets, torch.int64))
        # A plain attribute, not a buffer: DDP broadcasts buffers, and gloo has
        # no bool type.
        self.hashed = per_corner(hashed, torch.bool)
        # Corner offsets {0,1}^2 in the order (0,0), (1,0), (0,1), (1,1).
        self.register_buffer("cx", torch.tensor([0, 1, 0, 1], dtype=torch.int64).view(1, 1, 4))
        self.register_buffer("cy", torch.tensor([0, 0, 1, 1], dtype=torch.int64).view(1, 1, 4))
        self.any_hashed = any(hashed)
        self.all_hashed = all(hashed)
        # Hashed levels have size T, a power of two dividing 2^32, so
        # ((h mod 2^32) mod T) == h & (T - 1): one mask does both reductions.
        self.hash_mask = T - 1
        self.table = torch.nn.Embedding(offset, n_features, sparse=sparse)
        with torch.no_grad():
            self.table.weight.uniform_(-1e-4, 1e-4)

    def indices_and_weights(self, x):
        """x: (N, 2) float32 in [0,1]. Returns idx (N*L, 4) int64, w (N*L, 4) float32."""
        n = x.shape[0]
        nl4 = self.n_levels * 4
        pos = x.unsqueeze(1) * self.scale + 0.5          # (N, L, 2) float32
        gridf = torch.floor(pos)
        frac = pos - gridf
        grid = gridf.to(torch.int64)
        gx = (grid[..., 0:1] + self.cx).view(n, nl4)     # (N, L*4) corner coordinates
        gy = (grid[..., 1:2] + self.cy).view(n, nl4)
        if not self.all_hashed:
            # Dense: x + y*res, modulo the level size (tiny-cuda-nn wraps the
            # corner that steps one past the grid).
            dense_idx = torch.remainder(torch.addcmul(gx, gy, self.res), self.size)
        if self.any_hashed:
            # Hashed: ((x*1) XOR (y*2654435761)) mod 2^32 mod T, in int64
            # (coordinates are >= 0 and < 2^31, so the product cannot overflow).
            hash_idx = torch.bitwise_and(torch.bitwise_xor(gx, gy * self.PRIME_Y), self.hash_mask)
            idx = hash_idx if self.all_hashed else torch.where(self.hashed, hash_idx, dense_idx)
        else:
            idx = dense_idx
        idx = idx + self.offset
        fx = frac[..., 0:1]
        fy = frac[..., 1:2]
        ox = 1.0 - fx
        oy = 1.0 - fy
        w = torch.cat([ox * oy, fx * oy, ox * fy, fx * fy], dim=-1)  # (N, L, 4), corner order
        return idx.view(n * self.n_levels, 4), w.view(n * self.n_levels, 4)

    def forward(self, x):
        n = x.shape[0]
        idx, w = self.indices_and_weights(x)
        # Weighted sum of the 4 corners of every (sample, level): one bag each.
        feats = F.embedding_bag(idx, self.table.weight, per_sample_weights=w,
                                mode="sum", sparse=self.sparse)  # (N*L, F)
        return feats.view(n, self.n_levels * self.n_features)  # level-major


def make_mlp(n_in, n_neurons, n_hidden, n_out):
    layers = []
    width = n_in
    for _ in range(n_hidden):
        lin = torch.nn.Linear(width, n_neurons, bias=False)
        torch.nn.init.xavier_uniform_(lin.weight)
        layers += [lin, torch.nn.ReLU()]
        width = n_neurons
    lin = torch.nn.Linear(width, n_out, bias=False)
    torch.nn.init.xavier_uniform_(lin.weight)
    layers.append(lin)
    return torch.nn.Sequential(*layers)


def sample_targets(img, xy):
    """Bilinear image lookup, pixel centres at (i+0.5)/W, clamp to edge. img (H,W,3), xy (N,2)."""
    h, w = img.shape[0], img.shape[1]
    px = xy[:, 0] * w - 0.5
    py = xy[:, 1] * h - 0.5
    x0f = torch.floor(px)
    y0f = torch.floor(py)
    fx = (px - x0f).unsqueeze(1)
    fy = (py - y0f).unsqueeze(1)
    x0 = x0f.to(torch.int64)
    y0 = y0f.to(torch.int64)
    x1 = (x0 + 1).clamp_(0, w - 1)
    y1 = (y0 + 1).clamp_(0, h - 1)
    x0 = x0.clamp_(0, w - 1)
    y0 = y0.clamp_(0, h - 1)
    flat = img.view(-1, 3)
    c00 = flat[y0 * w + x0]
    c10 = flat[y0 * w + x1]
    c01 = flat[y1 * w + x0]
    c11 = flat[y1 * w + x1]
    top = c00 + (c10 - c00) * fx
    bot = c01 + (c11 - c01) * fx
    return top + (bot - top) * fy


def evaluate_psnr(enc, mlp, img, chunk):
    h, w = img.shape[0], img.shape[1]
    with torch.no_grad():
        xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w
        ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        xy = torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)
        target = img.view(-1, 3)
        se = 0.0
        for s in range(0, xy.shape[0], chunk):
            pred = mlp(enc(xy[s:s + chunk])).clamp_(0.0, 1.0)
            se += float(((pred - target[s:s + chunk]) ** 2).double().sum())
        mse = se / (h * w * 3)
    return float("inf") if mse <= 0 else -10.0 * math.log10(mse), mse


def main_ddp(a, img):
    """Data-parallel training with torch.nn.parallel.DistributedDataParallel
    over gloo: every rank draws batch/world samples, gradients (dense) are
    all-reduced in DDP's buckets. Rank 0 evaluates every --eval-every steps
    (not timed) and all ranks stop once --target-psnr is reached."""
    import datetime
    import torch.distributed as dist
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="tcp://" + a.ddp_master, rank=a.ddp_rank,
                            world_size=a.ddp_world,
                            timeout=datetime.timedelta(seconds=a.ddp_timeout))
    torch.manual_seed(a.seed)
    enc = HashGrid(a.n_levels, a.n_features, a.log2_hashmap_size, a.base_resolution,
                   a.per_level_scale, sparse=False)
    mlp = make_mlp(a.n_levels * a.n_features, a.n_neurons, a.n_hidden_layers, 3)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(enc, mlp))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.99), eps=1e-15)
    gen = torch.Generator().manual_seed(a.seed + 1 + a.ddp_rank)
    local = a.batch // a.ddp_world
    n_params = sum(p.numel() for p in model.parameters())
    log("ddp rank %d of %d: %d parameters (%.1f MB of gradient all-reduced per step)"
        % (a.ddp_rank, a.ddp_world, n_params, n_params * 4 / 1e6))
    elapsed, reached_at, reached_step, psnr = 0.0, None, None, float("nan")
    history = []
    t0 = time.perf_counter()
    step = 0
    for step in range(1, a.steps + 1):
        xy = torch.rand(local, 2, generator=gen)
        loss = F.mse_loss(model(xy), sample_targets(img, xy))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            elapsed += time.perf_counter() - t0
            stop = torch.zeros(1)
            if a.ddp_rank == 0:
                psnr, _ = evaluate_psnr(enc, mlp, img, a.eval_chunk)
                history.append([step, elapsed, psnr])
                log("step %d: %.2f dB after %.2f s" % (step, psnr, elapsed))
                if a.target_psnr is not None and psnr >= a.target_psnr and reached_at is None:
                    reached_at, reached_step = elapsed, step
                    stop[0] = 1
            dist.broadcast(stop, 0)
            if stop[0] > 0:
                break
            t0 = time.perf_counter()
    result = {"impl": "torch-ddp-gloo", "torch_version": torch.__version__, "rank": a.ddp_rank,
              "world": a.ddp_world, "steps": step, "batch": a.batch, "seconds": elapsed,
              "samples_per_s": step * a.batch / elapsed if elapsed > 0 else None,
              "psnr": psnr, "target_psnr": a.target_psnr, "seconds_to_target": reached_at,
              "step_reached": reached_step, "history": history,
              "grad_bytes_per_step": n_params * 4}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    img = load_image(a.image_raw, a.width, a.height)
    if a.ddp_rank is not None:
        return main_ddp(a, img)

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError as e:  # already set, or parallel work already started
        log("note: set_num_interop_threads(1) skipped: %s" % e)

    torch.manual_seed(a.seed)
    enc = HashGrid(a.n_levels, a.n_features, a.log2_hashmap_size, a.base_resolution, a.per_level_scale)
    mlp = make_mlp(a.n_levels * a.n_features, a.n_neurons, a.n_hidden_layers, 3)
    n_dense = sum(1 for lv in enc.levels if not lv["hashed"])
    blas = [t.split("=", 1)[1] for t in torch.__config__.show().replace(",", " ").split()
            if t.startswith("BLAS_INFO=")]
    if blas:
        # Debian's python3-torch calls the system libblas.so.3 for the MLP's
        # matrix products; "generic" there can mean the slow reference BLAS.
        log("torch BLAS_INFO=%s" % blas[0])
    log("torch %s, threads %d, image %dx%d, %d levels (%d dense, %d hashed), table %d x %d, "
        "MLP %d->%dx%d->3"
        % (torch.__version__, torch.get_num_threads(), a.width, a.height, a.n_levels, n_dense,
           a.n_levels - n_dense, enc.n_params_rows, a.n_features, a.n_levels * a.n_features,
           a.n_neurons, a.n_hidden_layers))

    opt_grid = torch.optim.SparseAdam(list(enc.table.parameters()), lr=a.lr, betas=(0.9, 0.99), eps=1e-15)
    opt_mlp = torch.optim.Adam(mlp.parameters(), lr=a.lr, betas=(0.9, 0.99), eps=1e-15)

    eval_steps = []
    for s in a.eval_steps:
        if s > a.steps:
            log("warning: --eval-steps %d is beyond --steps %d; ignored" % (s, a.steps))
        else:
            eval_steps.append(s)
    eval_set = set(eval_steps)
    psnr_at = {}

    elapsed = 0.0
    warm_elapsed = None  # the training time of the first --warmup-steps steps
    loss_val = float("nan")
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        xy = torch.rand(a.batch, 2)
        target = sample_targets(img, xy)
        pred = mlp(enc(xy))
        loss = F.mse_loss(pred, target)
        opt_grid.zero_grad(set_to_none=True)
        opt_mlp.zero_grad(set_to_none=True)
        loss.backward()
        opt_grid.step()
        opt_mlp.step()

        log_now = a.log_every > 0 and (step % a.log_every == 0 or step == a.steps)
        warm_now = step == a.warmup_steps
        if step in eval_set or log_now or step == a.steps or warm_now:
            t1 = time.perf_counter()
            elapsed += t1 - t0
            if warm_now:
                warm_elapsed = elapsed
            loss_val = float(loss.detach())
            if log_now:
                log("step %d/%d loss %.6g  %.0f samples/s"
                    % (step, a.steps, loss_val, step * a.batch / max(elapsed, 1e-12)))
            if step in eval_set:
                p, _ = evaluate_psnr(enc, mlp, img, a.eval_chunk)
                psnr_at[str(step)] = p
                log("step %d psnr %.3f dB" % (step, p))
            t0 = time.perf_counter()

    seconds = elapsed
    if str(a.steps) in psnr_at:
        psnr = psnr_at[str(a.steps)]
    else:
        psnr, _ = evaluate_psnr(enc, mlp, img, a.eval_chunk)
    log("done: %d steps in %.3f s, %.0f samples/s, final loss %.6g, psnr %.3f dB"
        % (a.steps, seconds, a.steps * a.batch / seconds, loss_val, psnr))

    result = {
        "impl": "torch",
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": a.steps,
        "batch": a.batch,
        "seconds": seconds,
        "samples_per_s": a.steps * a.batch / seconds if seconds > 0 else None,
        "warmup_steps": a.warmup_steps,
        "final_loss": loss_val,
        "psnr": psnr,
        "psnr_at": psnr_at,
    }
    if a.warmup_steps == 0:
        warm_elapsed = 0.0
    if warm_elapsed is not None and a.steps > a.warmup_steps and seconds > warm_elapsed:
        result["steady_samples_per_s"] = \
            (a.steps - a.warmup_steps) * a.batch / (seconds - warm_elapsed)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
