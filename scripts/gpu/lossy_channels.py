"""Per-channel z of a lossy study's runs (bench/mutation/study.py --lossy --blocks):
for DiT block outputs, the feature's own z_k on the calibration seeds (pooled spread
about each channel's mean, seed-to-seed correlation) and, per unseen seed and planted
bug, the channel the bug moves most: its z alone vs with the bug, and the threshold the
calibration file holds for it. z_k = mean(d_k) / (sd(d_k) / sqrt(n_k)), d = c - r over
the tokens of channel k (the last axis), docs/metrics.md.

    python3 scripts/gpu/lossy_channels.py STUDY_DIR/lossy FEATURE
"""
import glob
import json
import os
import sys

import h5py
import numpy as np


def z_of(ref, cand, path):
    with h5py.File(ref) as a, h5py.File(cand) as b:
        r = a[path][()].astype(np.float64)
        c = b[path][()].astype(np.float64)
    d = (c - r).reshape(-1, r.shape[-1])
    mu, se = d.mean(0), d.std(0, ddof=1) / np.sqrt(d.shape[0])
    with np.errstate(divide="ignore", invalid="ignore"):  # z 0 where nothing differs
        return np.where(mu == 0, 0.0, mu / se)


def main():
    root, feature = sys.argv[1], sys.argv[2]
    fdir = os.path.join(root, feature)
    with h5py.File(os.path.join(fdir, "cal-1.h5")) as f:
        steps = len(f["dit.step"])
    refdir = None  # the group whose references ran the feature's number of steps
    for d in sorted(glob.glob(os.path.join(root, "*"))):
        if os.path.exists(os.path.join(d, "ref-1.h5")):
            with h5py.File(os.path.join(d, "ref-1.h5")) as f:
                if len(f["dit.step"]) == steps:
                    refdir = d
                    break
    cal = json.load(open(os.path.join(fdir, "calibration.json")))
    cseeds = sorted(int(f.split("-")[1].split(".")[0]) for f in os.listdir(fdir) if f.startswith("cal-") and f.endswith(".h5"))
    tseeds = sorted(int(f.split("-")[1].split(".")[0]) for f in os.listdir(fdir) if f.startswith("feature-") and f.endswith(".h5"))
    for path in ["/dit.block/%04d/out" % b for b in range(4)]:
        zc = np.array([z_of(os.path.join(refdir, "ref-%d.h5" % s), os.path.join(fdir, "cal-%d.h5" % s), path) for s in cseeds])
        k_ = zc.shape[1]
        spread = np.sqrt(((zc - zc.mean(0)) ** 2).sum() / (k_ * (len(cseeds) - 1)))
        thr = cal.get("structure", {}).get(path, {}).get("channel_z_max_by_channel")
        corr = [round(float(np.corrcoef(zc[0], zc[i])[0, 1]), 2) for i in range(1, len(cseeds))]
        print("%s: K %d, calibration seeds %s: max |z| %s, spread %.2f, correlation with the first %s"
              % (path, k_, cseeds, np.round(np.abs(zc).max(1), 1).tolist(), spread, corr))
        for s in tseeds:
            ref = os.path.join(refdir, "ref-%d.h5" % s)
            zf = z_of(ref, os.path.join(fdir, "feature-%d.h5" % s), path)
            over = [k for k in range(k_) if thr and thr[k] is not None and abs(zf[k]) > thr[k]]
            print("  seed %d feature alone: max |z| %.1f (ch %d); channels above their threshold: %s"
                  % (s, np.abs(zf).max(), int(np.abs(zf).argmax()), over))
            for bug in sorted(glob.glob(os.path.join(fdir, "bug-*-%d.h5" % s))):
                zb = z_of(ref, bug, path)
                k = int(np.argmax(np.abs(zb - zf)))
                print("    %s: ch %d z %.1f -> %.1f (threshold %s); max |z| %.1f"
                      % (os.path.basename(bug)[4:-3], k, zf[k], zb[k], thr[k] if thr else None, np.abs(zb).max()))


if __name__ == "__main__":
    main()
