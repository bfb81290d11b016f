"""Learner-facing error messages of ``ddp_lab.parallel`` in English and Chinese (one table
for the subpackage, shared by its modules)."""

from __future__ import annotations

from ddp_lab.course.i18n import Messages

MESSAGES = Messages(
    __name__,
    {
        "not_module": {
            "en": "DataParallel wraps an nn.Module (your model), got {kind}. An optimizer is not "
            "a Module: keep it as it is and build it from model.parameters().",
            "zh": "DataParallel 包装的是 nn.Module（你的模型），但收到的是 {kind}。优化器不是 "
            "Module：保持原样，用 model.parameters() 创建它即可。",
        },
        "bad_devices": {
            "en": "device_ids must be a non-empty list of distinct device indices >= 0, got {value!r}.",
            "zh": "device_ids 必须是非空的、互不相同的设备编号（>= 0）列表，但收到的是 {value!r}。",
        },
        "bad_int": {
            "en": "{name} must be an integer >= {low}, got {value!r}.",
            "zh": "{name} 必须是 >= {low} 的整数，但收到的是 {value!r}。",
        },
        "bad_chunks": {
            "en": "chunk_sizes must be {count} positive integers that add up to {total} "
            "(the size of dim {dim}), got {value!r}.",
            "zh": "chunk_sizes 必须是 {count} 个正整数，且总和等于 {total}（第 {dim} 维的大小），"
            "但收到的是 {value!r}。",
        },
        "len_mismatch": {
            "en": "The number of modules {modules} is not equal to the number of {what} {count}.",
            "zh": "模块个数 {modules} 与 {what} 的个数 {count} 不相等。",
        },
        "dict_keys": {
            "en": "All dicts must have the same number of keys.",
            "zh": "所有 dict 的键个数必须相同。",
        },
        "no_batch": {
            "en": "BalancedDataParallel needs at least one tensor argument to find the batch size.",
            "zh": "BalancedDataParallel 至少需要一个张量参数来确定批大小。",
        },
    },
)
