"""MLP, LeNet-5, a small ResNet and logistic regression, looked up by name."""

from phalanx.models.zoo import (
    MODELS,
    build_model,
    count_parameters,
    lenet5,
    logreg,
    mlp,
    resnet,
)

__all__ = ["MODELS", "build_model", "count_parameters", "lenet5", "logreg", "mlp", "resnet"]
