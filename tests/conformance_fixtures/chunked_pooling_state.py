"""The ModelStates of ``chunked_mean_pooling`` / ``chunked_cls_pooling``: poolers that
lose what earlier chunks carried. Right when a prompt runs in one step, so only a check
that chunks prompts and compares with the reference sees them."""
from model_states.pooling import CLS, MEAN, PoolingModelState


class _ForgetsEarlierChunks(PoolingModelState):
    kind = MEAN

    def pool(self, hidden_states, batch):
        n = batch.num_reqs
        for i, row in enumerate(batch.idx_mapping_cpu[:n].tolist()):
            if int(batch.num_computed_cpu[i]) > 0 and self.pool_type_cpu[row] == self.kind:
                start = int(batch.query_start_loc_cpu[i])
                # what the row carries is replaced: mean starts over from zero, cls from this chunk's first token
                self.acc[row] = 0.0 if self.kind == MEAN else hidden_states[start].float()
        return super().pool(hidden_states, batch)


class MeanOfLastChunk(_ForgetsEarlierChunks):
    """Mean pooling sums only the prompt's last chunk (divided by the whole prompt length)."""

    kind = MEAN


class ClsOfLastChunk(_ForgetsEarlierChunks):
    """CLS pooling takes the first token of the prompt's last chunk."""

    kind = CLS
