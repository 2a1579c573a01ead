"""The frontend: load and check the ONNX model, bind its shapes (model), rewrite what TVM's importer
mishandles (rewrites), take out If/Loop the profiles make static (control_flow), split it for partial offload (partition, units) and import it into Relax
(relax_import)."""
from .model import (LoadedModel, TensorInfo, bind_profiles, check_configurations, check_operators, load_model,
                    profile_shapes, random_inputs)
from .control_flow import without_static_control_flow
from .relax_import import import_relax

__all__ = ["LoadedModel", "TensorInfo", "bind_profiles", "check_configurations", "check_operators", "import_relax",
           "load_model", "profile_shapes", "random_inputs", "without_static_control_flow"]
