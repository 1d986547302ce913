"""Collectives on CPU torch tensors through nexar's core module (DLPack, zero-copy; the
core package itself never imports torch)."""

import pytest

import nexar
from conftest import run_ranks

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", (1, 2, 4))
@pytest.mark.parametrize("tdtype", ("float32", "float16", "bfloat16", "int64"))
def test_torch_tensors_in_place(worlds, n, tdtype):
    """CPU torch tensors (DLPack, zero-copy): results land in the tensor itself; bfloat16
    and float16 reduce with nexar's own kernels."""
    dt = getattr(torch, tdtype)
    inputs = [torch.arange(33, dtype=torch.float32).mul(0.25).add(r).to(dt) for r in range(n)]

    def rank(c):
        t = inputs[c.rank].clone()
        ptr = t.data_ptr()
        assert c.all_reduce(t) is t
        assert t.data_ptr() == ptr
        y = torch.zeros(33 * n, dtype=dt)
        c.all_gather(t, y)
        return t, y

    want = sum(x.to(torch.float64) for x in inputs)
    tol = {"float32": 1e-6, "float16": 1e-2, "bfloat16": 2e-2, "int64": 0}[tdtype]
    for t, y in run_ranks(worlds[n], rank):
        torch.testing.assert_close(t.to(torch.float64), want, rtol=tol, atol=tol)
        for r in range(n):
            assert torch.equal(y[33 * r:33 * (r + 1)], t)


def test_tensor_that_requires_grad(worlds):
    """A leaf that requires grad is reduced through its detached view (like tensor.data)."""
    def rank(c):
        p = torch.ones(4, requires_grad=True)
        c.all_reduce(p)
        return p.detach().clone()

    for p in run_ranks(worlds[2], rank):
        assert torch.equal(p, torch.full((4,), 2.0))
