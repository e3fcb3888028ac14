"""Models by name. Each builder takes the input shape (C, H, W) and the number of classes.

Every model is an ``nn.Sequential`` of named top-level layers, so model-parallel and
pipeline strategies can cut it between layers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from phalanx.catalog import Catalog
from phalanx.errors import ConfigError
from phalanx.models.ctr import ctr
from phalanx.models.gpt import gpt


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 256) -> nn.Sequential:
    features = int(torch.tensor(input_shape).prod())
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(features, hidden)),
        ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(hidden, hidden // 2)),
        ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(hidden // 2, num_classes)),
    ]))


def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Multinomial logistic regression: one linear layer on the flattened input, no buffers
    (a convex loss, for optimizers that have an oracle, e.g. L-BFGS)."""
    features = int(torch.tensor(input_shape).prod())
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(features, num_classes)),
    ]))


def lenet5(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """LeNet-5 (ReLU, max-pool), padded so 28x28 inputs keep the classic 32x32 geometry."""
    c, h, w = input_shape
    if h < 12 or w < 12:
        raise ConfigError(f"--model lenet5: needs images of at least 12x12, got {h}x{w}")
    flat_h, flat_w = ((h // 2) - 4) // 2, ((w // 2) - 4) // 2
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(c, 6, 5, padding=2)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(6, 16, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(16 * flat_h * flat_w, 120)),
        ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(120, 84)),
        ("relu4", nn.ReLU()),
        ("fc3", nn.Linear(84, num_classes)),
    ]))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def resnet(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Sequential:
    """A small ResNet (3 stages of one BasicBlock each, BatchNorm, dropout before the head)."""
    c = input_shape[0]
    return nn.Sequential(OrderedDict([
        ("stem", nn.Sequential(nn.Conv2d(c, width, 3, padding=1, bias=False),
                               nn.BatchNorm2d(width), nn.ReLU())),
        ("block1", BasicBlock(width, width)),
        ("block2", BasicBlock(width, 2 * width, stride=2)),
        ("block3", BasicBlock(2 * width, 4 * width, stride=2)),
        ("pool", nn.AdaptiveAvgPool2d(1)),
        ("flatten", nn.Flatten()),
        ("dropout", nn.Dropout(0.2)),
        ("fc", nn.Linear(4 * width, num_classes)),
    ]))


# every model --model offers: adding one is its builder ((input_shape, num_classes) ->
# nn.Module) and one line here
MODELS: Catalog[Callable[..., nn.Module]] = Catalog("model", "--model")
MODELS.add("mlp", mlp, "a two-hidden-layer perceptron")
MODELS.add("lenet5", lenet5, "LeNet-5 (conv)")
MODELS.add("resnet", resnet, "a small ResNet")
MODELS.add("logreg", logreg, "logistic regression (a linear classifier)")
MODELS.add("gpt", gpt, "a decoder-only transformer on token windows (--gpt-layers, ...)")
MODELS.add("ctr", ctr, "a click-through-rate model: hashed sparse embeddings + wide&deep "
           "(--ctr-rows, --ctr-dim)")

# models that set their own initial weights (he_init is for ReLU networks)
OWN_INIT = frozenset({"gpt", "ctr"})
# the task each named model is for (phalanx.data.Dataset.task); the rest classify images
MODEL_TASKS = {"gpt": "lm", "ctr": "ctr"}
# models whose embedding table gets sparse gradients (strategies declare "sparse_grads")
SPARSE_GRADS = frozenset({"ctr"})


CTR_LR = 0.05


@dataclass(frozen=True)
class Recipe:
    """A model's own training recipe, used when the user names neither ``--rule`` nor
    ``--lr`` (a transformer does not train with the image models' SGD)."""

    rule: str
    lr: float
    schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0


# the GPT's: AdamW at 2e-3 after 100 linear warm-up steps, then constant: for its one-epoch
# default run constant beat warm-up + cosine (to 0) by 0.037 and 0.032 nats on seeds 0, 1,
# and 2e-3 beat nanoGPT's 1e-3 (docs/workloads.md has the measurements)
RECIPES = {"gpt": Recipe("adamw", 2e-3, "constant", 100, 0.1),
           # the click model's: AdaGrad, the usual rule for sparse CTR tables (each row
           # steps by its own gradient history, so rare ids still learn); on a row no batch
           # touched its update is exactly 0, so updating only the touched rows is the
           # dense update (docs/workloads.md has the measurements behind it)
           "ctr": Recipe("adagrad", CTR_LR)}


def model_options(cfg, data=None) -> dict[str, object]:
    """The sizes ``--model`` takes from a run configuration (the GPT's flags) and, for the
    click model, from the training set ``data`` (its dense features)."""
    if cfg.model == "ctr":
        dense = int(data.info.get("dense_features", 0)) if data is not None else 0
        return {"dense": dense, "rows": cfg.ctr_rows, "dim": cfg.ctr_dim}
    if cfg.model == "gpt":
        return {"layers": cfg.gpt_layers, "heads": cfg.gpt_heads, "dim": cfg.gpt_dim,
                "dropout": cfg.dropout}
    return {}


def check_task(name: str, task: str, data: str) -> None:
    """Refuse, in one line, a named model on data of another kind."""
    wants = MODEL_TASKS.get(name, "classify")
    if wants != task:
        what = {"classify": "images", "lm": "text (token windows)", "ctr": "click logs"}
        models = [m for m in MODELS.names() if MODEL_TASKS.get(m, "classify") == task]
        raise ConfigError(f"--model {name}: takes {what.get(wants, wants)} but --data {data} is "
                          f"{what.get(task, task)} (use --model {' or '.join(models)})")


def he_init(model: nn.Module) -> nn.Module:
    """He (Kaiming) normal initialisation of every conv and linear weight that feeds a ReLU,
    zero biases; the last Linear (the classifier, which feeds the softmax) gets gain 1.

    PyTorch's default (Kaiming-uniform with a=sqrt(5)) is tuned for no particular
    activation; for these ReLU models He init trains faster (measured: LeNet-5, Fashion-MNIST,
    3 epochs of momentum SGD: 0.881 -> 0.887 test accuracy). The ReLU gain sqrt(2) on the
    classifier made the first logits large (LeNet-5 on Fashion-MNIST: initial loss 2.7-4.6
    over seeds 0-4 instead of ln 10 = 2.30; the first SGD step raised it to 5.8-6.6) and at
    lr 0.2 one seed in five died at loss ln 10 (every ReLU off); with gain 1, none did
    (issue #25, docs/data-parallel.md)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            last = bool(linears) and module is linears[-1]
            nn.init.kaiming_normal_(module.weight, nonlinearity="linear" if last else "relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                **options: object) -> nn.Module:
    """Model ``name`` for inputs of ``input_shape`` and ``num_classes`` outputs;
    ``options``: the model's own sizes (the GPT's layers, heads, dim, dropout)."""
    model = MODELS.get(name)(tuple(input_shape), num_classes, **options)
    return model if name in OWN_INIT else he_init(model)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
