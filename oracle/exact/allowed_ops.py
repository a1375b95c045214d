"""The stock torch operations exact-v1 code may use, each with the reason its result is the same
bits on every CPU build (with or without MKL) and on CUDA (docs/exact-v1.md §11 gives the
reasons in full). tests/oracle/test_exact_audit.py refuses anything else on the exact paths;
tests/oracle/test_op_conformance.py checks the arithmetic classes result for result.
"""

from __future__ import annotations

# Classes of reason (docs/exact-v1.md §11):
TYPE = "type"          # a dtype or class: no arithmetic
SETTING = "setting"    # a switch, context manager or autograd driver: no arithmetic of its own
DATA = "data"          # creates, copies, selects, reshapes or classifies values: no rounding
IEEE = "ieee"          # one IEEE basic operation per element (or an exact selection / scaling)
INTEGER = "integer"    # int64 arithmetic on values far from overflow: exact
EXACT_SUM = "exact-sum"  # sums of integer-valued float64 below 2^53: exact in any order
BOUND = "bound"        # used only to pick between two paths that give the same exact value

# Classes whose every operation tests/oracle/test_op_conformance.py compares with a reference.
CHECKED = (IEEE, INTEGER, EXACT_SUM)

# The exact-path modules besides oracle/exact/*.py (the torch-native profile, oracle/native.py,
# is not one).
EXACT_PATH_FILES = (
    "oracle/optim.py", "oracle/rng.py", "oracle/models.py", "oracle/profiles.py", "oracle/step.py",
    "oracle/norm_bucket.py", "oracle/schedule.py",
)

TORCH_NAMES = {
    "torch.Tensor": TYPE,
    "torch.float32": TYPE,
    "torch.float64": TYPE,
    "torch.int64": TYPE,
    "torch.int32": TYPE,
    "torch.bool": TYPE,
    "torch.int8": TYPE,
    "torch.autograd.Function": TYPE,
    "torch.device": TYPE,
    "torch.autograd.grad": SETTING,
    "torch.no_grad": SETTING,
    "torch.get_num_threads": SETTING,
    "torch.broadcast_shapes": SETTING,
    "torch.set_float32_matmul_precision": SETTING,
    "torch.set_flush_denormal": SETTING,
    "torch.use_deterministic_algorithms": SETTING,
    "torch.backends.cuda.matmul.allow_tf32": SETTING,
    "torch.backends.cudnn.allow_tf32": SETTING,
    "torch.backends.cudnn.benchmark": SETTING,
    "torch.backends.cudnn.deterministic": SETTING,
    "torch.arange": DATA,
    "torch.cat": DATA,
    "torch.stack": DATA,
    "torch.empty": DATA,
    "torch.full": DATA,
    "torch.full_like": DATA,
    "torch.ones": DATA,
    "torch.ones_like": DATA,
    "torch.zeros": DATA,
    "torch.zeros_like": DATA,
    "torch.tensor": DATA,
    "torch.from_numpy": DATA,
    "torch.gather": DATA,
    "torch.where": DATA,
    "torch.unique": DATA,
    "torch.count_nonzero": DATA,
    "torch.any": DATA,
    "torch.isfinite": DATA,
    "torch.isnan": DATA,
    "torch.abs": IEEE,
    "torch.amax": IEEE,
    "torch.aminmax": IEEE,
    "torch.clamp": IEEE,
    "torch.copysign": IEEE,
    "torch.div": IEEE,
    "torch.frexp": IEEE,
    "torch.mul": IEEE,
    "torch.round": IEEE,
    "torch.remainder": INTEGER,
    "torch.bitwise_and": INTEGER,
    "torch.bitwise_left_shift": INTEGER,
    "torch.bitwise_right_shift": INTEGER,
    "torch.sum": EXACT_SUM,
    "torch.matmul": EXACT_SUM,
    "torch._int_mm": EXACT_SUM,
    "torch.linalg.vector_norm": BOUND,
}

TENSOR_METHODS = {
    "backward": SETTING,
    "requires_grad_": SETTING,
    "detach": SETTING,
    "clone": DATA,
    "contiguous": DATA,
    "dim": DATA,
    "expand": DATA,
    "is_contiguous": DATA,
    "item": DATA,
    "movedim": DATA,
    "numel": DATA,
    "numpy": DATA,
    "reshape": DATA,
    "split": DATA,
    "squeeze": DATA,
    "t": DATA,
    "tolist": DATA,
    "transpose": DATA,
    "tril": DATA,
    "unsqueeze": DATA,
    "view": DATA,
    "index_select": DATA,
    "scatter_": DATA,
    "all": DATA,
    "any": DATA,
    "add": IEEE,
    "add_": IEEE,
    "sub_": IEEE,
    "mul": IEEE,
    "mul_": IEEE,
    "floor_": IEEE,
    "round_": IEEE,
    "to": IEEE,
    "max": IEEE,
    "min": IEEE,
    "index_add_": EXACT_SUM,
}

# Python operators on tensors (not seen by the name scan; `@` and `**` on tensors are refused).
OPERATORS = {
    "+": IEEE, "-": IEEE, "*": IEEE, "/": IEEE, "unary -": IEEE, "< <= > >= == !=": IEEE,
    "~, &, ^, bitwise or": INTEGER, "<< >>": INTEGER, "%": INTEGER,
}
