"""The cached launch path (fold_kernels.launch): its specialization key on CPU, and on a GPU the
cached launches against Triton's own path, bit for bit, across the specializations that the key
must tell apart (pointer alignment, ints equal to 1 / divisible by 16, dtypes)."""

import pytest
import torch
from fold_kernels import launch

GPU = torch.cuda.is_available()


def test_key_separates_what_triton_specializes():
    x = torch.zeros(64)
    k = launch.spec_key
    assert k([x]) != k([x[1:]])  # 16-byte aligned pointer vs not
    assert k([x]) != k([x.to(torch.float64)])  # dtype
    assert k([1]) != k([2])  # == 1 is a constant in Triton
    assert k([32]) != k([33])  # divisible by 16
    assert k([2**31 - 16]) != k([2**31 + 16])  # int32 vs int64
    assert k([3]) == k([5])  # same specialization, same compiled kernel
    assert k([x[4:]]) == k([x[8:]])  # both 16-byte aligned
    assert k([None, 1.5, True]) == k([None, 2.5, False])
    with pytest.raises(TypeError):
        k(["a string"])


def test_inlined_key_equals_the_per_argument_key():
    x = torch.zeros(64)
    args = [x, x[1:], x.to(torch.float64), torch.nn.Parameter(torch.zeros(3)), 0, 1, -1, 16,
            -32, 33, 2**31 - 16, 2**31, -(2**31), -(2**31) - 16, 2**40, 1.5, True, False, None]
    assert launch.spec_key(args) == tuple(launch._arg_key(a) for a in args)


def test_interpreter_and_off_switch_take_tritons_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not launch.enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("FOLD_KERNELS_FAST_LAUNCH", "0")
    assert not launch.enabled()


def _ops_cases(device):
    import importlib

    from fold_kernels.elementwise import bias_sigmoid_gate

    # the modules (fold_kernels re-exports functions of the same names)
    evo_attention = importlib.import_module("fold_kernels.evo_attention")
    layer_norm = importlib.import_module("fold_kernels.layer_norm")

    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16, offset=0):
        t = torch.randn(int(torch.tensor(shape).prod()) + offset, generator=g)
        return t[offset:].view(*shape).to(device=device, dtype=dtype).requires_grad_()

    cases = []
    for dtype in (torch.bfloat16, torch.float32):
        for offset in (0, 1):  # an unaligned base pointer after an aligned one
            x = rnd(3, 17, 48, dtype=dtype, offset=offset)
            w, b = rnd(48, dtype=dtype), rnd(48, dtype=dtype)
            cases.append(("layer_norm", lambda x=x, w=w, b=b: layer_norm.layer_norm(x, w, b),
                          [x, w, b]))
            gate = rnd(3, 17, 48, dtype=dtype, offset=offset)
            cases.append(("gate", lambda x=x, gt=gate: bias_sigmoid_gate(x, gt), [x, gate]))
    q, k, v = (rnd(1, 3, 2, 33, 16) for _ in range(3))
    bias = rnd(1, 2, 33, 33)
    mask = torch.rand(1, 3, 33, generator=g).to(device) > 0.3
    cases.append(("evo_attention",
                  lambda: evo_attention.evo_attention(q, k, v, bias, mask), [q, k, v, bias]))
    return cases


@pytest.mark.skipif(not GPU, reason="the cached path launches compiled CUDA kernels")
def test_cached_launches_equal_tritons_path(monkeypatch):
    device = torch.device("cuda")
    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("FOLD_KERNELS_FAST_LAUNCH", mode)
        out = []
        for _, fn, leaves in _ops_cases(device):
            for _ in range(2):  # the second call of each specialization is a cached launch
                y = fn()
                dy = torch.ones_like(y)
                grads = torch.autograd.grad(y, leaves, dy)
            out.append([y.detach().clone(), *[g.clone() for g in grads]])
        results[mode] = out
    for (name, _, _), a, b in zip(_ops_cases(device), results["0"], results["1"]):
        for ta, tb in zip(a, b):
            assert torch.isfinite(tb).all(), name
            assert torch.equal(ta, tb), name


def test_an_empty_hook_chain_is_handed_to_the_launcher_as_none():
    def hook(metadata):
        return None

    assert launch.active_hook(None) is None
    assert launch.active_hook(hook) is hook  # a Triton whose hooks are plain attributes
    chain_cls = getattr(pytest.importorskip("triton.knobs"), "HookChain", None)
    if chain_cls is None:
        pytest.skip("this Triton keeps no hook chains")
    chain = chain_cls()
    assert launch.active_hook(chain) is None  # nothing to run: no metadata, no calls
    chain.add(hook)
    assert launch.active_hook(chain) is chain
    chain.remove(hook)
    assert launch.active_hook(chain) is None


@pytest.mark.skipif(not GPU, reason="the cached path launches compiled CUDA kernels")
def test_a_profilers_launch_hook_sees_cached_launches(monkeypatch):
    """Triton's launch hooks (a profiler's) run on cached launches, with the kernel's name in
    the metadata, and stop once removed."""
    from fold_kernels.elementwise import bias_sigmoid_gate
    from triton import knobs

    monkeypatch.setenv("FOLD_KERNELS_FAST_LAUNCH", "1")
    x, gate = (torch.randn(3, 17, 48, device="cuda") for _ in range(2))
    bias_sigmoid_gate(x, gate)  # compiled and cached: the calls below are cached launches
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    rt = knobs.runtime
    chain = hasattr(rt.launch_enter_hook, "add")
    if chain:
        rt.launch_enter_hook.add(hook)
    else:
        monkeypatch.setattr(rt, "launch_enter_hook", hook)
    try:
        bias_sigmoid_gate(x, gate)
        torch.cuda.synchronize()
    finally:
        if chain:
            rt.launch_enter_hook.remove(hook)
        else:
            monkeypatch.setattr(rt, "launch_enter_hook", None)
    assert seen and all(isinstance(n, str) and n for n in seen), seen
    count = len(seen)
    bias_sigmoid_gate(x, gate)
    assert len(seen) == count


def test_launch_args_hand_tensors_over_as_their_pointers():
    x = torch.zeros(64)
    args = [x, x[1:], 7, 2.5, None, True]
    keys, launched = launch.launch_args(args)
    assert keys == [launch._arg_key(a) for a in args]
    assert launched == [x.data_ptr(), x[1:].data_ptr(), 7, 2.5, None, True]


def test_direct_launch_only_where_tritons_call_is_known():
    class Launcher:  # scratch sizes unknown: the launcher's own __call__ must run
        launch = staticmethod(lambda *a: None)

    assert launch.direct_launch(Launcher()) is None


@pytest.mark.skipif(not GPU, reason="the cached path launches compiled CUDA kernels")
def test_a_cpu_tensor_after_cached_launches_gets_tritons_error(monkeypatch):
    """The cached path hands pointers over unchecked: a CPU tensor must miss the cache and meet
    Triton's own check, never reach a kernel as a host pointer."""
    import triton
    import triton.language as tl

    @launch.fast
    @triton.jit
    def copy(X, Y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)

    monkeypatch.setenv("FOLD_KERNELS_FAST_LAUNCH", "1")
    x = torch.randn(100, device="cuda")
    y = torch.empty_like(x)
    for _ in range(2):  # the second is a cached launch
        copy[(2,)](x, y, 100, BLOCK=64)
    assert torch.equal(x, y)
    assert launch.launch_args([x])[0] != launch.launch_args([x.cpu()])[0]
    with pytest.raises(ValueError, match="cpu tensor"):
        copy[(2,)](x.cpu(), y, 100, BLOCK=64)
    torch.cuda.synchronize()


@pytest.mark.skipif(not GPU, reason="the cached path launches compiled CUDA kernels")
def test_a_repeated_call_hits_the_cache(monkeypatch):
    """The key a launch looks up is the key its miss stored: the second call of the same
    specialization launches from the cache (a key computed two ways would miss every time and
    still give right results, only slowly)."""
    from fold_kernels.elementwise import bias_sigmoid_gate

    monkeypatch.setenv("FOLD_KERNELS_FAST_LAUNCH", "1")
    x, gate = (torch.randn(5, 17, 48, device="cuda") for _ in range(2))
    expected = bias_sigmoid_gate(x, gate)

    def no_miss(self, *args):
        raise AssertionError(f"cache miss on a repeated call of {self.jit}")

    monkeypatch.setattr(launch.FastKernel, "_miss", no_miss)
    assert torch.equal(bias_sigmoid_gate(x, gate), expected)
