"""The random graph and the neighbour sampler of the end-to-end benchmarks (sage_e2e.py, rgcn_e2e.py).

Plain PyTorch on whatever device the tensors are on: the benchmarks run it on the GPU (the GPU machines have no
pyg-lib or torch-sparse), the CPU tests (test_sage_e2e.py, test_rgcn_e2e.py) on the CPU.
"""

import torch


def random_csr(num_nodes: int, mean_degree: int, generator: torch.Generator, device):
    """A random directed graph as CSR: node v's in-neighbours are col[row_ptr[v]:row_ptr[v+1]], degrees uniform in
    [1, 2 * mean_degree - 1]."""
    degree = torch.randint(1, 2 * mean_degree, (num_nodes,), device=device, generator=generator)
    row_ptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    row_ptr[1:] = torch.cumsum(degree, 0)
    col = torch.randint(0, num_nodes, (int(row_ptr[-1]),), device=device, generator=generator)
    return row_ptr, col


def sample_edges(row_ptr, nodes, fanout: int, generator: torch.Generator):
    """`fanout` incoming edges of each node, uniformly with replacement: [len(nodes), fanout] positions in col."""
    start = row_ptr[nodes]
    degree = row_ptr[nodes + 1] - start
    pick = (torch.rand((nodes.numel(), fanout), device=nodes.device, generator=generator) * degree[:, None]).long()
    return start[:, None] + pick


def sample_neighbours(row_ptr, col, nodes, fanout: int, generator: torch.Generator):
    """`fanout` in-neighbours of each node, uniformly with replacement: [len(nodes), fanout] node ids."""
    return col[sample_edges(row_ptr, nodes, fanout, generator)]


def relabel(targets, neighbours):
    """The unique nodes of targets and neighbours with the targets first (in order), and the neighbours' positions
    in that list: (nodes, local [len(targets), fanout])."""
    everything = torch.cat([targets, neighbours.reshape(-1)])
    unique, inverse = torch.unique(everything, return_inverse=True)
    first = torch.full((unique.numel(),), everything.numel(), dtype=torch.int64, device=targets.device)
    first.scatter_reduce_(0, inverse, torch.arange(everything.numel(), device=targets.device), reduce="amin")
    order = torch.argsort(first)  # by first occurrence: the (unique) targets keep positions 0..len(targets)-1
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    local = rank[inverse]
    return unique[order], local[targets.numel():].view(neighbours.shape)


def sample_batch(row_ptr, col, seeds, fanouts, generator, etype=None):
    """Two hops: blocks[0] for the outer layer (seeds <- hop-1 nodes), blocks[1] for the inner one (hop-1 nodes
    <- hop-2 nodes); returns (input node ids, blocks, number of hop-1 nodes) with each block's neighbours as local
    ids [targets, fanout] into the next node list. With `etype` (the edge types, [len(col)]) each block is the
    pair (local ids, the sampled edges' types), both [targets, fanout]."""
    blocks = []
    nodes = [seeds]
    for fanout in fanouts:
        edges = sample_edges(row_ptr, nodes[-1], fanout, generator)
        following, local = relabel(nodes[-1], col[edges])
        blocks.append(local if etype is None else (local, etype[edges]))
        nodes.append(following)
    return nodes[2], tuple(blocks), nodes[1].numel()


def random_unified_features(num_nodes: int, dim: int, generator: torch.Generator, device):
    """A [num_nodes, dim] float32 table in unified memory (pinned, GPU-mapped), drawn on the GPU with `generator`
    and written through the table's CUDA alias 256 MiB at a time: no CPU loop over tens of GB."""
    import hectorgen_runtime as hr  # (here: the sampler above needs no runtime)

    features = hr.empty_unified(num_nodes, dim, dtype=torch.float32)
    alias = features.cuda_view()
    step = max(1, (256 << 20) // (dim * 4))
    for begin in range(0, num_nodes, step):
        end = min(begin + step, num_nodes)
        alias[begin:end].copy_(torch.randn(end - begin, dim, device=device, generator=generator))
    torch.cuda.synchronize()
    return features
