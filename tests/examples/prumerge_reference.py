"""A restatement of LLaVA-PruMerge's released selection and merge (42Shawn/LLaVA-PruMerge,
`llava/model/multimodal_encoder/clip_encoder.py`, `outlier_dectection` and
`CLIPVisionTower.token_prune_merge_advanced`, from `cls_attn = attn[:, 0, 1:]` on), batch 1,
written from that code: numpy percentiles, the topk, `complement_idx`, the per-token loop over
"the rest" (kept before i, kept after i, then the others) with topk(32) by key cosine, the
attention-weighted sums and the extra token."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def outlier_dectection(attn):
    attn_np = attn.to(dtype=torch.float32).cpu().numpy().flatten()
    Q1 = np.percentile(attn_np, 25)
    Q3 = np.percentile(attn_np, 75)
    IQR = Q3 - Q1
    upper_bound = Q3 + 1.5 * IQR
    outlier_indices = np.where((attn_np > upper_bound))[0]
    return len(outlier_indices) / len(attn_np)


def complement_idx(idx, dim):
    a = torch.arange(dim, device=idx.device)
    ndim = idx.ndim
    dims = idx.shape
    n_idx = dims[-1]
    dims = dims[:-1] + (-1, )
    for _ in range(1, ndim):
        a = a.unsqueeze(0)
    a = a.expand(*dims)
    masked = torch.scatter(a, -1, idx, 0)
    compl, _ = torch.sort(masked, dim=-1, descending=False)
    compl = compl.permute(-1, *tuple(range(ndim - 1)))
    compl = compl[n_idx:].permute(*(tuple(range(1, ndim)) + (0,)))
    return compl


def released_prumerge(cls_attn: torch.Tensor, keys: torch.Tensor, features: torch.Tensor):
    """cls_attn (N,), keys (N, c) (no [CLS]), features (N, C) -> (idx (left,) in topk order,
    updated tokens (left + 1, C): the merged kept ones in idx order, then the extra token)."""
    cls_attn, Key_wo_cls, image_features = cls_attn[None], keys[None], features[None]
    B, N, C = image_features.shape
    reduction_ratio = outlier_dectection(cls_attn)
    _, idx = torch.topk(cls_attn, int(N * reduction_ratio), dim=1, largest=True)
    index = idx.unsqueeze(-1).expand(-1, -1, C)
    x_others = torch.gather(image_features, dim=1, index=index)
    x_others_attn = torch.gather(cls_attn, dim=1, index=idx)
    Key_others = torch.gather(Key_wo_cls, dim=1, index=idx.unsqueeze(-1).expand(-1, -1, Key_wo_cls.shape[-1]))
    compl = complement_idx(idx, N)
    non_topk = torch.gather(image_features, dim=1, index=compl.unsqueeze(-1).expand(-1, -1, C))
    non_topk_Key = torch.gather(Key_wo_cls, dim=1, index=compl.unsqueeze(-1).expand(-1, -1, Key_wo_cls.shape[-1]))
    non_topk_attn = torch.gather(cls_attn, dim=1, index=compl)
    Key_others_norm = F.normalize(Key_others, p=2, dim=-1)
    non_topk_Key_norm = F.normalize(non_topk_Key, p=2, dim=-1)
    B, left_tokens, C = x_others.size()
    updated_x_others = torch.zeros_like(x_others)
    for b in range(B):
        for i in range(left_tokens):
            key_others_norm = Key_others_norm[b, i, :].unsqueeze(0).unsqueeze(0)
            before_i_Key = Key_others_norm[b, :i, :].unsqueeze(0)
            after_i_Key = Key_others_norm[b, i + 1:, :].unsqueeze(0)
            before_i_x_others = x_others[b, :i, :].unsqueeze(0)
            after_i_x_others = x_others[b, i + 1:, :].unsqueeze(0)
            rest_x_others = torch.cat([before_i_x_others, after_i_x_others, non_topk[b, :, :].unsqueeze(0)], dim=1)
            before_i_x_others_attn = x_others_attn[b, :i].unsqueeze(0)
            after_i_x_others_attn = x_others_attn[b, i + 1:].unsqueeze(0)
            rest_x_others_attn = torch.cat([before_i_x_others_attn, after_i_x_others_attn,
                                            non_topk_attn[b, :].unsqueeze(0)], dim=1)
            rest_Keys = torch.cat([before_i_Key, after_i_Key, non_topk_Key_norm[b, :, :].unsqueeze(0)], dim=1)
            cos_sim_matrix = torch.bmm(key_others_norm, rest_Keys.transpose(1, 2))
            _, cluster_indices = torch.topk(cos_sim_matrix, k=int(32), dim=2, largest=True)
            cluster_tokens = rest_x_others[:, cluster_indices.squeeze(), :]
            weights = rest_x_others_attn[:, cluster_indices.squeeze()].unsqueeze(-1)
            weighted_avg = torch.sum(cluster_tokens * weights, dim=1)
            updated_center = weighted_avg + x_others[b, i, :]
            updated_x_others[b, i, :] = updated_center
    extra_one_token = torch.sum(non_topk * non_topk_attn.unsqueeze(-1), dim=1, keepdim=True)
    updated_x_others = torch.cat([updated_x_others, extra_one_token], dim=1)
    return idx[0], updated_x_others[0]
