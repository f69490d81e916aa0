#!/usr/bin/env python3
"""Programs of test_procs_capture.py: the toy pipeline's modules
(scripts/example/) run in several processes and threads.

    procs_program.py mp fork|spawn SAVE      the toy pipeline inside one
                                             multiprocessing.Process; the
                                             parent taps nothing
    procs_program.py pool fork|spawn SAVE    a multiprocessing pool of 2, each
                                             task (one per process) running the
                                             toy pipeline (SAVE/task-<k>/)
    procs_program.py loader fork|spawn SAVE  DataLoader workers (2) run the
                                             text encoder on 4 prompts; the
                                             main process runs the DiT on each
                                             batch of embeddings
    procs_program.py loader-encode SAVE      as loader fork, the workers calling
                                             the toy pipeline's encode_prompt
    procs_program.py late-fork SAVE          as loader fork, but the main
                                             process runs the DiT once before
                                             the workers are forked
    procs_program.py osfork|osfork-exit SAVE the main process runs the DiT, then
                                             os.fork(): the child runs the text
                                             encoder 3 times and exits normally
    procs_program.py threads SAVE            4 threads x 3 calls of one text
                                             encoder, each thread its prompts
    procs_program.py pipe-threads SAVE       2 threads, each running the whole
                                             toy pipeline (SAVE/pipe-<j>/)
    procs_program.py abi SAVE                the tap ABI's per-process calls
                                             with bad and good input (ctypes)

SAVE: a directory where the program writes, with numpy, what each component
returned (independently of probe): <who>.<component>.<k>.npy.
"""
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "example"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import toy_modules as tm  # noqa: E402

PROMPTS = ["a red fox", "a blue bird", "green hills at dawn", "snow on pines"]


def save(d, name, t):
    np.save(os.path.join(d, name + ".npy"), t.detach().cpu().numpy())


def text_encoder():
    torch.manual_seed(0)
    return tm.ToyTextEncoder(dim=32, heads=4, layers=2, max_length=16).eval()


def denoiser():
    torch.manual_seed(1)
    return tm.ToyDiTDenoiser(in_channels=4, dim=64, heads=4, blocks=2, text_dim=32, patch=2).eval()


def run_pipeline(d):
    import toy_pipeline
    torch.set_num_threads(1)
    rc = toy_pipeline.main(["--steps", "2", "--frames", "2", "--height", "32", "--width", "32",
                            "--save", d])
    if rc:
        raise SystemExit(rc)


class Prompts(torch.utils.data.Dataset):
    def __init__(self, d, via_pipeline=False):
        self.d = d
        self.enc = text_encoder()
        self.pipe = None
        if via_pipeline:
            import toy_pipeline
            self.pipe = toy_pipeline.ToyVideoPipeline(weight_seed=0)

    def __len__(self):
        return len(PROMPTS)

    def __getitem__(self, i):
        ids, mask = tm.byte_tokenize([PROMPTS[i]], 16)
        with torch.no_grad():
            if self.pipe is not None:
                e = self.pipe.encode_prompt(PROMPTS[i])[0]
            else:
                e = self.enc(ids, mask).last_hidden_state[0]
        save(self.d, "worker.text_encoder.%d" % i, e)
        return e


def run_dit(dit, emb, k, d):
    torch.manual_seed(100 + k)
    x = torch.randn(emb.shape[0], 4, 1, 8, 8)
    t = torch.full((emb.shape[0],), 500.0)
    with torch.no_grad():
        out = dit(x, t, emb).sample
    save(d, "main.dit.%d" % k, out)


def loader(method, d, late, via_pipeline=False):
    torch.set_num_threads(1)
    dit = denoiser()
    k = 0
    if late:
        run_dit(dit, torch.zeros(1, 16, 32), k, d)
        k += 1
    dl = torch.utils.data.DataLoader(Prompts(d, via_pipeline), batch_size=2, num_workers=2,
                                     multiprocessing_context=method)
    for emb in dl:
        run_dit(dit, emb, k, d)
        k += 1
    print("loader: %d DiT calls" % k)


def threads(d):
    torch.set_num_threads(1)
    enc = text_encoder()

    def work(j):
        for i in range(3):
            ids, mask = tm.byte_tokenize([PROMPTS[j] + " #%d" % i], 16)
            with torch.no_grad():
                e = enc(ids, mask).last_hidden_state
            save(d, "thread%d.text_encoder.%d" % (j, i), e)

    ts = [threading.Thread(target=work, args=(j,), name="enc-%d" % j) for j in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("threads: done")


def pipe_threads(d):
    ts = []
    for j in range(2):
        sub = os.path.join(d, "pipe-%d" % j)
        os.makedirs(sub, exist_ok=True)
        ts.append(threading.Thread(target=run_pipeline, args=(sub,), name="pipe-%d" % j))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("pipe-threads: done")


def abi():
    import ctypes
    lib = ctypes.CDLL(None)
    side, close, tap = lib.probe_tap_sidecar_v1, lib.probe_tap_close_v1, lib.probe_tap_v1
    side.argtypes, side.restype = [ctypes.c_char_p], ctypes.c_int
    taken = lib.probe_tap_sidecar_if_taken_v1
    taken.argtypes, taken.restype = [ctypes.c_char_p], ctypes.c_int
    print("if_taken %r = %d" % (b"bad/", taken(b"bad/")))
    print("if_taken %r = %d" % (b"procZ", taken(b"procZ")))
    for name in (None, b"", b"x1", b"proc/1", b"proc 1", b"proc" + b"a" * 61, b"rank0"):
        print("sidecar %r = %d" % (name, side(name)))
    print("sidecar %r = %d" % (b"procA_1-x", side(b"procA_1-x")))
    print("sidecar again same = %d" % side(b"procA_1-x"))
    print("sidecar again other = %d" % side(b"procB"))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "components", "python"))
    from probe_adapter import _abi
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    shape = (ctypes.c_int64 * 2)(2, 3)
    desc = _abi.ProbeTapTensorV1(struct_size=ctypes.sizeof(_abi.ProbeTapTensorV1), abi_version=1,
                                 component=b"abi", slot=b"out", call=0, step=-1, cfg_branch=-1,
                                 device=-1, dtype=12, rank=2, shape=shape, strides=None,
                                 data=t.data_ptr(), stream=None, timestep=float("nan"))
    tap.argtypes = [ctypes.POINTER(_abi.ProbeTapTensorV1)]
    print("tap = %d" % tap(ctypes.byref(desc)))
    print("sidecar after tap = %d" % side(b"procC"))
    print("close = %d" % close())
    desc.call = 1
    print("tap after close = %d" % tap(ctypes.byref(desc)))
    print("close again = %d" % close())


def main():
    mode, d = sys.argv[1], sys.argv[-1]
    if mode == "mp":
        import multiprocessing as mp
        p = mp.get_context(sys.argv[2]).Process(target=run_pipeline, args=(d,))
        p.start()
        p.join()
        print("mp: child exit %s" % p.exitcode)
        return p.exitcode
    if mode == "pool":
        import multiprocessing as mp
        subs = [os.path.join(d, "task-%d" % k) for k in range(2)]
        for s in subs:
            os.makedirs(s, exist_ok=True)
        pool = mp.get_context(sys.argv[2]).Pool(2, maxtasksperchild=1)
        pool.map(run_pipeline, subs, chunksize=1)
        pool.close()
        pool.join()
        print("pool: done")
        return 0
    if mode == "loader":
        loader(sys.argv[2], d, False)
    elif mode == "loader-encode":
        loader("fork", d, False, True)
    elif mode in ("osfork", "osfork-exit"):
        torch.set_num_threads(1)
        run_dit(denoiser(), torch.zeros(1, 16, 32), 0, d)
        pid = os.fork()
        if pid == 0:
            enc = text_encoder()
            ids, mask = tm.byte_tokenize(PROMPTS[:1], 16)
            with torch.no_grad():
                for _ in range(3):
                    enc(ids, mask)
            if mode == "osfork-exit":
                os._exit(0)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("osfork: child status %d" % status)
    elif mode == "late-fork":
        loader("fork", d, True)
    elif mode == "threads":
        threads(d)
    elif mode == "pipe-threads":
        pipe_threads(d)
    elif mode == "abi":
        abi()
    else:
        print("unknown mode %s" % mode, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
