"""MLP, LeNet-5, a small ResNet, logistic regression and a GPT, looked up by name."""

from phalanx.models.gpt import generate, gpt
from phalanx.models.loss import TokenCrossEntropy, correct, token_cross_entropy
from phalanx.models.zoo import (
    MODELS,
    RECIPES,
    Recipe,
    build_model,
    check_task,
    count_parameters,
    lenet5,
    logreg,
    mlp,
    model_options,
    resnet,
)

__all__ = ["MODELS", "build_model", "count_parameters", "lenet5", "logreg", "mlp", "resnet",
           "gpt", "generate", "RECIPES", "Recipe", "check_task", "model_options",
           "TokenCrossEntropy", "correct", "token_cross_entropy"]
