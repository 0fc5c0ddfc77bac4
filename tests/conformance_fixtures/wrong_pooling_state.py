"""The ModelState of ``wrong_pooling``: every pooled vector is scaled by 1.01."""
from model_states.pooling import PoolingModelState


class ScaledPoolingState(PoolingModelState):
    def pool(self, hidden_states, batch):
        return [None if v is None else v * 1.01 for v in super().pool(hidden_states, batch)]
