"""Export tiny real PyTorch models to ONNX as fidelity fixtures for `graph_autofusion.zoo`.

The zoo builds its graphs by hand so that the project needs no PyTorch; these fixtures are the
ground truth it is checked against: op-type histograms of real `torch.onnx.export` output, for the
TorchScript exporter (``dynamo=False``, opset 17) and the dynamo exporter (``dynamo=True``,
opset 18), of small hand-written versions of each zoo architecture.

PyTorch is *not* a dependency of the project.  Run this script from a separate environment, e.g.::

    python3.11 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 onnx==1.23.2 onnxscript==0.7.2
    /tmp/torchvenv/bin/python scripts/export_torch_fixtures.py [--out tests/data/torch_exports]

It writes ``<model>_tiny_<style>_opset<N>.onnx`` (each well under 1 MB, about 2.9 MB in all),
plus ``<model>_tiny_<style>_dynamic_opset<N>.onnx`` for BERT and GPT-2 exported with symbolic
batch and sequence axes, ``<model>_sdpa_tiny_dynamo_opset18.onnx`` for BERT, GPT-2 and ViT with
torch's fused ``scaled_dot_product_attention`` (the default of transformers and timm, so what a
user's export holds), and prints each file's op-type histogram.  The export is deterministic
(``torch.manual_seed(0)``); tests/graph_autofusion/zoo/test_zoo_fidelity.py compares the zoo's
graphs with these files.  The modules mirror the layer structure of the architectures the zoo
imitates (Hugging Face BERT and GPT-2, torchvision ResNet and MobileNetV2, a timm-style ViT) at
toy sizes.
"""

from __future__ import annotations

import argparse
import collections
import math
from pathlib import Path

import onnx
import torch
from torch import nn

# ---------------------------------------------------------------------------------------------
# MLP


class Mlp(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (64, 32, 16, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# ---------------------------------------------------------------------------------------------
# ResNet (torchvision Bottleneck layout)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (1, 1, 1, 1), width: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks: list[nn.Module] = []
        cin = width
        for stage, n in enumerate(layers):
            w = width * 2**stage
            for b in range(n):
                blocks.append(Bottleneck(cin, w, 2 if (b == 0 and stage > 0) else 1))
                cin = w * 4
        self.layers = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# ---------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision layout)


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(cin * expand)
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, width_mult: float = 0.25, classes: int = 10) -> None:
        super().__init__()
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 2, 2]]
        cin = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        feats: list[nn.Module] = [_conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in setting:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                feats.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        feats.append(_conv_bn_relu6(cin, last // 8, 1, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last // 8, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


# ---------------------------------------------------------------------------------------------
# BERT (Hugging Face layout, eager attention)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.sdpa = False

    def split(self, x: torch.Tensor) -> torch.Tensor:
        new_shape = (*x.size()[:-1], self.heads, self.head_dim)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        if self.sdpa:
            ctx = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).permute(0, 2, 1, 3)
            return ctx.reshape((*ctx.size()[:-2], self.heads * self.head_dim))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = nn.functional.softmax(scores + mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view((*ctx.size()[:-2], self.heads * self.head_dim))


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attn = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.inter = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln1(self.drop(self.attn_out(self.attn(x, mask))) + x)
        h = nn.functional.gelu(self.inter(x))
        return self.ln2(self.drop(self.out(h)) + x)


class Bert(nn.Module):
    def __init__(self, layers: int = 2, hidden: int = 32, heads: int = 2, vocab: int = 64, pos: int = 32):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(pos, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.register_buffer("position_ids", torch.arange(pos).unsqueeze(0), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, pos, dtype=torch.long), persistent=False)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        seq = input_ids.size(1)
        pos_ids = self.position_ids[:, :seq]
        tt = self.token_type_ids[:, :seq].expand(input_ids.size(0), seq)
        x = self.word(input_ids) + self.token_type(tt) + self.position(pos_ids)
        x = self.ln(x)
        mask = attention_mask[:, None, None, :].to(torch.float32)
        mask = (1.0 - mask) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, pooled


# ---------------------------------------------------------------------------------------------
# GPT-2 (Hugging Face layout: Conv1D = addmm on a 2-D view, causal mask buffer + where)


class Conv1D(nn.Module):
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = (*x.size()[:-1], self.nf)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Gpt2Block(nn.Module):
    def __init__(self, hidden: int, heads: int, max_pos: int) -> None:
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = Conv1D(3 * hidden, hidden)
        self.c_proj = Conv1D(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = Conv1D(4 * hidden, hidden)
        self.mlp_proj = Conv1D(hidden, 4 * hidden)
        bias = torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)).view(1, 1, max_pos, max_pos)
        self.register_buffer("bias", bias, persistent=False)
        self.sdpa = False

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        new_shape = (*x.size()[:-1], self.heads, self.hidden // self.heads)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).split(self.hidden, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        if self.sdpa:
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3)
            return self.c_proj(out.reshape((*out.size()[:-2], self.hidden)))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        qlen, klen = q.size(-2), k.size(-2)
        causal = self.bias[:, :, klen - qlen : klen, :klen]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = nn.functional.softmax(w, dim=-1)
        out = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        out = out.view((*out.size()[:-2], self.hidden))
        return self.c_proj(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.mlp_proj(h)


class Gpt2(nn.Module):
    def __init__(self, layers: int = 2, hidden: int = 32, heads: int = 2, vocab: int = 64, pos: int = 32):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(pos, hidden)
        self.h = nn.ModuleList(Gpt2Block(hidden, heads, pos) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.size(-1)
        pos = torch.arange(0, seq, dtype=torch.long).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------------------------
# ViT (timm layout: packed qkv, pre-norm blocks, class token, head on token 0)


class VitAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.sdpa = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.sdpa:
            x = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
            return self.proj(x)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class VitBlock(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, eps=1e-6)
        self.attn = VitAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-6)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class Vit(nn.Module):
    def __init__(self, image: int = 32, patch: int = 8, hidden: int = 32, layers: int = 2, heads: int = 2):
        super().__init__()
        n = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, hidden, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, hidden) * 0.02)
        self.blocks = nn.Sequential(*(VitBlock(hidden, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.blocks(x + self.pos_embed)
        x = self.norm(x)
        return self.head(x[:, 0])


# ---------------------------------------------------------------------------------------------


def _sdpa(module: nn.Module) -> nn.Module:
    """The module with torch's fused scaled_dot_product_attention in every attention layer: what
    Hugging Face transformers and timm run (and so export) by default."""
    for layer in module.modules():
        if hasattr(layer, "sdpa"):
            layer.sdpa = True
    return module


def _cases() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...], list[str], list[str]]]:
    ids = torch.randint(0, 64, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    img = torch.randn(2, 3, 32, 32)
    return {
        "mlp": (Mlp(), (torch.randn(2, 64),), ["input"], ["logits"]),
        "resnet": (ResNet(), (img,), ["input"], ["logits"]),
        "mobilenet_v2": (MobileNetV2(), (img,), ["input"], ["logits"]),
        "bert": (
            Bert(),
            (ids, mask),
            ["input_ids", "attention_mask"],
            ["last_hidden_state", "pooler_output"],
        ),
        "gpt2": (Gpt2(), (ids,), ["input_ids"], ["logits"]),
        "vit": (Vit(), (img,), ["input"], ["logits"]),
        "bert_sdpa": (
            _sdpa(Bert()),
            (ids, mask),
            ["input_ids", "attention_mask"],
            ["last_hidden_state", "pooler_output"],
        ),
        "gpt2_sdpa": (_sdpa(Gpt2()), (ids,), ["input_ids"], ["logits"]),
        "vit_sdpa": (_sdpa(Vit()), (img,), ["input"], ["logits"]),
    }


def histogram(model: onnx.ModelProto) -> dict[str, int]:
    """Op types of the main graph, most frequent first."""
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _export(module, inputs, in_names, out_names, path: Path, style: str, opset: int, dynamic: bool) -> None:
    kwargs: dict = {}
    if dynamic and style == "torchscript":
        kwargs["dynamic_axes"] = {n: {0: "batch", 1: "sequence"} for n in in_names}
    elif dynamic:
        batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("sequence", min=2, max=32)
        kwargs["dynamic_shapes"] = {n: {0: batch, 1: seq} for n in in_names}
    torch.onnx.export(
        module,
        inputs,
        str(path),
        input_names=in_names,
        output_names=out_names,
        opset_version=opset,
        dynamo=style == "dynamo",
        external_data=False,
        **kwargs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/torch_exports"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, (module, inputs, in_names, out_names) in _cases().items():
        module.eval()
        # Sequence models are usually exported with dynamic axes, which keeps the shape arithmetic
        # (Shape/Gather/Unsqueeze/Concat) in the graph; static exports fold it into constants.
        variants = [("torchscript", 17, False), ("dynamo", 18, False)]
        if name.endswith("_sdpa"):  # the fused attention's export, as dynamo writes it
            variants = [("dynamo", 18, False)]
        if name in ("bert", "gpt2"):
            variants += [("torchscript", 17, True), ("dynamo", 18, True)]
        for style, opset, dynamic in variants:
            tag = f"{style}_dynamic" if dynamic else style
            path = args.out / f"{name}_tiny_{tag}_opset{opset}.onnx"
            _export(module, inputs, in_names, out_names, path, style, opset, dynamic)
            model = onnx.load(str(path))
            onnx.checker.check_model(model, full_check=True)
            print(f"{path.name} ({path.stat().st_size} bytes): {histogram(model)}")


if __name__ == "__main__":
    main()
