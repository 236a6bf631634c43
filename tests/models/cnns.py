"""Small ResNet and MobileNetV3-small equivalents of torchvision's.

torchvision 0.28 (the release for torch 2.13) ships only a CUDA build that
does not load on CPU torch (docs/architecture.md, facts), so the zoo builds the same blocks
here: the same layer order, BatchNorm placement, downsample shortcuts,
squeeze-excitation and activations as ``torchvision.models.resnet`` and
``torchvision.models.mobilenetv3``, at widths small enough for CI.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


# ------------------------------------------------------------------ ResNet
class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock``: conv-bn-relu-conv-bn + shortcut, relu."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet stem (7x7/2 conv, bn, relu, 3x3/2 max pool),
    one BasicBlock per stage, global average pool, fc."""

    def __init__(self, widths=(8, 16), num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks, inplanes = [], widths[0]
        for i, planes in enumerate(widths):
            blocks.append(BasicBlock(inplanes, planes, stride=1 if i == 0 else 2))
            inplanes = planes
        self.layers = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(x.flatten(1))


# ------------------------------------------------------------- MobileNetV3
def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation as MobileNetV3 uses it (hardsigmoid scale)."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.fc2(F.relu(self.fc1(scale))))
        return scale * x


def _conv_bn_act(cin, cout, kernel, stride=1, groups=1, act=nn.Hardswish):
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand 1x1, depthwise kxk, optional squeeze-excitation, project 1x1;
    a residual connection when shape allows (torchvision's order)."""

    def __init__(self, cin, expanded, cout, kernel, use_se, act, stride):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        layers = []
        if expanded != cin:
            layers.append(_conv_bn_act(cin, expanded, 1, act=act))
        layers.append(_conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(_conv_bn_act(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        out = self.block(x)
        return out + x if self.use_res else out


class MobileNetV3Small(nn.Module):
    """MobileNetV3-small's structure at a fraction of its width: stem, three
    inverted residuals (SE+ReLU stride 2, ReLU stride 2, SE+hardswish with a
    residual), last 1x1 conv, pool, Linear-hardswish-Dropout-Linear head."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.2, width: int = 1):
        super().__init__()
        w = width  # every channel count times this
        settings = [  # cin, expanded, cout, kernel, use_se, act, stride
            (8 * w, 8 * w, 8 * w, 3, True, nn.ReLU, 2),
            (8 * w, 24 * w, 16 * w, 3, False, nn.ReLU, 2),
            (16 * w, 32 * w, 16 * w, 5, True, nn.Hardswish, 1),
        ]
        self.features = nn.Sequential(
            _conv_bn_act(3, 8 * w, 3, stride=2),
            *[InvertedResidual(*s) for s in settings],
            _conv_bn_act(16 * w, 48 * w, 1),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(48 * w, 64 * w), nn.Hardswish(), nn.Dropout(dropout),
                                        nn.Linear(64 * w, num_classes))
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))
