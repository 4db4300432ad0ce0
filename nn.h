// qknorm's public header for the nn layer, with the tensor engine (qk.h) under it.
//
// Installed as <qk/nn.h> (`pkg-config --cflags --libs qk`): modules and layers, the GPT with its
// QK-norm attention, optimisers (AdamW, Muon, QK-Clip), data, checkpoints, sampling, sweeps and
// the trainer behind the qknorm program, all in namespace qk::nn.
#pragma once

#include "qk.h"

#include "nn/hf/hf.h"
#include "nn/lab/inspect.h"
#include "nn/lab/sweep.h"
#include "nn/model/attention.h"
#include "nn/model/config.h"
#include "nn/model/gpt.h"
#include "nn/model/kv_cache.h"
#include "nn/model/layers.h"
#include "nn/model/module.h"
#include "nn/model/sample.h"
#include "nn/optim/data_parallel.h"
#include "nn/optim/loss_scale.h"
#include "nn/optim/lr_schedule.h"
#include "nn/optim/muon.h"
#include "nn/optim/optim.h"
#include "nn/optim/qk_clip.h"
#include "nn/optim/zero.h"
#include "nn/signals/plot.h"
#include "nn/text/data.h"
#include "nn/text/modality.h"
#include "nn/text/prepare.h"
#include "nn/text/shards.h"
#include "nn/text/tokenizer.h"
#include "nn/train/checkpoint.h"
#include "nn/train/fine_tune.h"
#include "nn/train/run_optimizer.h"
#include "nn/train/train_config.h"
#include "nn/train/train_data.h"
#include "nn/train/trainer.h"
