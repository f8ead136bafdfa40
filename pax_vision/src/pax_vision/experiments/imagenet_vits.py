"""Vision Transformers on ImageNet (Dosovitskiy et al. 2021) with the plain-ViT recipe of
Beyer et al. 2022 ("Better plain ViT baselines"): 224x224 in 16x16 patches, mean pooling, a
zero-initialised head, batch 1024, Adam (0.9, 0.999) at 1e-3 with 10,000 warm-up steps and a
cosine decay over 90 epochs, decoupled weight decay 0.1 (x the learning rate), gradients
clipped to norm 1, mixup 0.2. The encoder blocks are pax-transformer's, non-causal."""

from __future__ import annotations

import fiddle as fdl

from pax_vision.experiments.base import ImageClassificationExperiment, ImagenetData
from pax_vision.layers.vit import VisionTransformer


class ViTB16Pjit(ImagenetData, ImageClassificationExperiment):
    """ViT-B/16: 12 layers of width 768, 12 heads, MLP 3072 (86M parameters)."""

    PATCH_SIZE = 16
    MODEL_DIMS = 768
    NUM_LAYERS = 12
    NUM_HEADS = 12
    HIDDEN_DIMS = 3072
    POOLING = "gap"
    USE_REPEATED_LAYER = False
    CHECKPOINT_POLICY: str | None = None
    HEAD_INIT_STD = 0.0
    MIXUP_ALPHA = 0.2
    BATCH_SIZE = 1024
    OPTIMIZER = "adam"
    LEARNING_RATE = 1e-3
    WEIGHT_DECAY = 0.1
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_SCHEDULE = "cosine"
    LR_COS_WARMUP = 10_000
    NUM_EPOCHS = 90
    EVAL_INTERVAL_STEPS = ImagenetData.NUM_TRAIN_EXAMPLES // BATCH_SIZE  # an epoch: 1251
    NUM_TRAIN_STEPS = NUM_EPOCHS * EVAL_INTERVAL_STEPS
    SUMMARY_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 5000
    ICI_MESH_SHAPE = [1, 8, 1]

    def backbone(self) -> fdl.Config[VisionTransformer]:
        return fdl.Config(VisionTransformer, patch_size=self.PATCH_SIZE,
                          model_dims=self.MODEL_DIMS, num_layers=self.NUM_LAYERS,
                          num_heads=self.NUM_HEADS, hidden_dims=self.HIDDEN_DIMS,
                          pooling=self.POOLING, scan_layers=self.USE_REPEATED_LAYER,
                          remat_policy=self.CHECKPOINT_POLICY, dtype=self.FPROP_DTYPE)


class ViTS16Pjit(ViTB16Pjit):
    """ViT-S/16: 12 layers of width 384, 6 heads, MLP 1536 (22M parameters)."""

    MODEL_DIMS = 384
    NUM_HEADS = 6
    HIDDEN_DIMS = 1536


class ViTL16Pjit(ViTB16Pjit):
    """ViT-L/16: 24 layers of width 1024, 16 heads, MLP 4096 (304M parameters), its layers
    scanned and rematerialised."""

    MODEL_DIMS = 1024
    NUM_LAYERS = 24
    NUM_HEADS = 16
    HIDDEN_DIMS = 4096
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"
