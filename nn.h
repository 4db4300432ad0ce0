// qknorm's public header for the nn layer, with the tensor engine (qk.h) under it.
//
// Installed as <qk/nn.h> (`pkg-config --cflags --libs qk`): modules and layers, the GPT with its
// QK-norm attention, optimisers (AdamW, Muon, QK-Clip), data, checkpoints, sampling, sweeps and
// the trainer behind the qknorm program, all in namespace qk::nn.
#pragma once

#include "qk.h"

#include "nn/attention.h"
#include "nn/checkpoint.h"
#include "nn/config.h"
#include "nn/data.h"
#include "nn/data_parallel.h"
#include "nn/fine_tune.h"
#include "nn/gpt.h"
#include "nn/hf.h"
#include "nn/inspect.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/loss_scale.h"
#include "nn/modality.h"
#include "nn/module.h"
#include "nn/muon.h"
#include "nn/optim.h"
#include "nn/plot.h"
#include "nn/prepare.h"
#include "nn/qk_clip.h"
#include "nn/run_optimizer.h"
#include "nn/sample.h"
#include "nn/shards.h"
#include "nn/sweep.h"
#include "nn/tokenizer.h"
#include "nn/train_config.h"
#include "nn/train_data.h"
#include "nn/trainer.h"
#include "nn/zero.h"
