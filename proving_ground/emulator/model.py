"""K26EmulatedDeepseekV3ForCausalLM: SGLang's DeepseekV3 target plus, after each forward, the
calibrated K2.6 step cost as a GPU busy-wait (wait.step_wait). Test-only: the proving ground serves
it; the product never imports it.

The outputs are the parent's, untouched: the wait reads the batch's shape and sequence lengths and
writes only its own scratch tensor, so drafters keep their acceptance and lossless checks hold.

SGLang 0.5.11 finds it through `SGLANG_EXTERNAL_MODEL_PACKAGE=proving_ground.emulator`
(srt/models/registry.py: `import_model_classes` imports every module of that package and registers
each `EntryClass` under its class name, overwriting). An emulated folder's config.json lists
`["K26EmulatedDeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"]`: the registry resolves the first it
knows, and SGLang's MLA checks (configs/model_config.py: `"DeepseekV3ForCausalLM" in architectures`)
still see the second. Without the variable the registry silently serves the plain DeepseekV3, so
the model logs what it emulates at load: a server log without that line is not emulating.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

from proving_ground.emulator.calibration import Costs
from proving_ground.emulator.folder import EMULATOR_LOG_MARK
from proving_ground.emulator.wait import step_wait

logger = logging.getLogger(__name__)


class K26EmulatedDeepseekV3ForCausalLM(DeepseekV3ForCausalLM):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        block = config.k26_emulator
        self.k26_costs = Costs.from_block(block["costs"])
        self.k26_subtract_us = dict(block["subtract_us"])
        logger.info(EMULATOR_LOG_MARK + " box %s, layout %s, rho %g, subtract_us %s", self.k26_costs.box,
                    self.k26_costs.layout, self.k26_costs.rho, self.k26_subtract_us)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        out = super().forward(input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
        step_wait(self.k26_costs, self.k26_subtract_us, forward_batch, positions.shape[0])
        return out


EntryClass = K26EmulatedDeepseekV3ForCausalLM
