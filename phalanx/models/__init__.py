"""MLP, LeNet-5 and a small ResNet, looked up by name."""

from phalanx.models.zoo import MODELS, build_model, count_parameters, lenet5, mlp, resnet

__all__ = ["MODELS", "build_model", "count_parameters", "lenet5", "mlp", "resnet"]
