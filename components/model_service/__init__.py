"""The model-service family's one seam: ``ModelService`` (:mod:`.service`), its typed
``ModelServiceArgs`` and the pod's constants (:mod:`.args`), and the pod template it runs
(:mod:`.pod`), which the rollout components wrap."""

from components.model_service.args import ModelServiceArgs, RolloutWorkload
from components.model_service.pod import build_pod_template
from components.model_service.service import ModelService

__all__ = ["ModelService", "ModelServiceArgs", "RolloutWorkload", "build_pod_template"]
