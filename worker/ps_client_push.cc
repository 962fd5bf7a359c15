// PsClient's pushes (ps_client.h): worker Adam (here or on the model's
// device), the split among shards, the codecs with their error feedback,
// and the send.
//
// Thread safety: see ps_client.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "common/counter_rng.h"
#include "common/row_width.h"
#include "common/uninit_vector.h"
#include "worker/ps_client.h"
#include "worker/ps_client_internal.h"
#include "worker/worker_adam.h"

namespace gridsync {

using ps_internal::Clock;
using ps_internal::FeedbackKey;
using ps_internal::ScopedSeconds;
using ps_internal::Seconds;
using ps_internal::SplitAll;

bool PsClient::Compresses(const wire::OutBlock& block) const {
  const size_t n = size_t{block.row_count} * block.width;
  return n != 0 && n <= kMaxCodecValues && n * sizeof(float) >= min_bytes_;
}

Status PsClient::CompressAll(uint64_t step, const std::vector<bool>& on_device,
                             std::vector<std::vector<wire::OutBlock>>* split) {
  // Blocks that share an error-feedback key (one table's slice, cut by rows
  // across shards) run in order on one thread; distinct keys in parallel,
  // their tables made first. The bytes are the same as on one thread.
  const bool codec_on = codec_.codec != Codec::kNone;
  std::map<uint64_t, std::vector<std::pair<uint32_t, wire::OutBlock*>>> by_key;
  for (uint32_t s = 0; s < split->size(); ++s) {
    for (auto& block : (*split)[s]) {
      const bool device = on_device[block.table];
      if (!codec_on || !Compresses(block)) {
        if (!device) continue;
        // Sent as values: they come from the device.
        block.values.resize(size_t{block.row_count} * block.width);
        GRIDSYNC_RETURN_IF_ERROR(device_source_
                                     ->Fetch(block.table, block.col_begin, block.width,
                                             block.rows.data(), block.row_count,
                                             block.values.data())
                                     .WithContext("table " + std::to_string(block.table) +
                                                  ": copying the push from the model's device"));
        continue;
      }
      const uint64_t key = FeedbackKey(block.table, block.col_begin);
      if (use_feedback_ && !device) feedback_.Reserve(key, block.width);
      by_key[key].emplace_back(s, &block);
    }
  }
  std::vector<const std::vector<std::pair<uint32_t, wire::OutBlock*>>*> groups;
  for (const auto& [key, blocks] : by_key) groups.push_back(&blocks);
  std::vector<Status> status(groups.size());
  std::vector<uint64_t> values(groups.size(), 0);
  settle_.resize(groups.size());
  for (auto& items : settle_) items.clear();
  auto compress = [&](size_t g) {
    // One block per shard: a message lists each table once (the shards
    // refuse a second listing), so no block of a push reads residuals
    // another block of it stores, and all are stored after the send.
    for (const auto& [shard, block] : *groups[g]) {
      values[g] += size_t{block->row_count} * block->width;
      status[g] = Compress(step, shard, on_device[block->table], block, &settle_[g]);
      if (!status[g].ok()) return;
    }
  };
  ParallelForOn(pool_, groups.size(), compress);
  for (size_t g = 0; g < groups.size(); ++g) {
    GRIDSYNC_RETURN_IF_ERROR(status[g]);
    counters_.values_compressed += values[g];
  }
  return Status::OK();
}

void PsClient::AddResidualOf(uint32_t shard, uint64_t key, const uint32_t* rows, size_t n,
                             uint32_t width, float* values) const {
  const auto table = static_cast<uint32_t>(key >> 32);
  const auto col_begin = static_cast<uint32_t>(key);
  const wire::OutBlock* pulled = nullptr;
  const float* pending = nullptr;
  if (shard < pull_pending_at_.size() && !pull_pending_at_[shard].empty()) {
    const auto& blocks = pull_blocks_[shard];
    for (size_t b = 0; b < blocks.size(); ++b) {
      const PendingBlock& p = pull_pending_at_[shard][b];
      if (blocks[b].table != table || blocks[b].col_begin != col_begin || p.at == kNoPending)
        continue;
      if (p.gathered && blocks[b].width == width && p.version == feedback_.VersionOf(key)) {
        pulled = &blocks[b];
        pending = pull_pending_[shard].data() + p.at;
      }
      break;
    }
  }
  if (pulled == nullptr) return feedback_.AddResidual(key, rows, n, width, values);
  // Both row lists ascend: one walk finds each pushed row among the pulled
  // ones (a step pushes the rows it pulled, so the table is rarely asked).
  std::vector<size_t> missed;  // indices of pushed rows the pull did not ask for
  const size_t m = pulled->row_count;
  // The width as a constant: rows are a few floats (common/row_width.h).
  WithRowWidth(width, [&](auto constant) {
    const uint32_t w = RowWidth(constant, width);
    size_t j = 0;
    for (size_t r = 0; r < n; ++r) {
      const uint32_t row = rows[r];
      const float* residual = nullptr;
      if (pulled->dense) {
        if (row >= pulled->row_begin && row - pulled->row_begin < m)
          residual = pending + size_t{row - pulled->row_begin} * w;
      } else {
        while (j < m && pulled->rows[j] < row) ++j;
        if (j < m && pulled->rows[j] == row) residual = pending + j * w;
      }
      if (residual == nullptr) {
        missed.push_back(r);
        continue;
      }
      float* v = values + r * w;
      for (uint32_t f = 0; f < w; ++f) v[f] += residual[f];
    }
  });
  if (missed.empty()) return;
  // Those from the table, in one call (the same additions).
  std::vector<uint32_t> missed_rows(missed.size());
  std::vector<float> missed_values(missed.size() * width);
  for (size_t i = 0; i < missed.size(); ++i) {
    missed_rows[i] = rows[missed[i]];
    std::copy_n(values + missed[i] * width, width, missed_values.data() + i * width);
  }
  feedback_.AddResidual(key, missed_rows.data(), missed.size(), width, missed_values.data());
  for (size_t i = 0; i < missed.size(); ++i)
    std::copy_n(missed_values.data() + i * width, width, values + missed[i] * width);
}

void PsClient::SettleGroup(std::vector<Settle>* items) {
  for (Settle& item : *items) {
    const size_t n = item.rows.size();
    feedback_.StoreResidual(item.key, item.rows.data(), n, item.width, item.corrected.data(),
                            item.decoded.data());
    if (item.mask) {
      worker_adam_->MaskMomentum(item.table, item.rows.data(), n, item.col_begin, item.width,
                                 item.decoded.data());
    }
  }
  items->clear();
}

void PsClient::SettleAll() {
  const ScopedSeconds timed(&counters_.codec_seconds);
  ParallelForOn(pool_, settle_.size(), [&](size_t g) { SettleGroup(&settle_[g]); });
}

Status PsClient::Compress(uint64_t step, uint32_t shard, bool on_device, wire::OutBlock* block,
                          std::vector<Settle>* settle) {
  const size_t n = size_t{block->row_count} * block->width;
  const uint64_t key = FeedbackKey(block->table, block->col_begin);
  std::vector<uint32_t> dense_rows;
  const uint32_t* rows = block->rows.data();
  if (block->dense) {
    dense_rows.resize(block->row_count);
    for (uint32_t i = 0; i < block->row_count; ++i) dense_rows[i] = block->row_begin + i;
    rows = dense_rows.data();
  }
  block->codec = codec_;
  block->codec_seed = CounterRandom(codec_seed_, step, (uint64_t{block->table} << 32) | shard);
  block->payload.resize(EncodedSize(block->codec, n));
  // DGC's momentum factor masking: a sparsifying codec delivers a value
  // after many steps; the momentum that built it up would otherwise keep
  // pushing the same way. Where the block keeps every value (ratio 1, or k
  // rounded up to n in a small block) nothing is held back, and masking
  // would only turn Adam's momentum off (measured: -1.5 dB at 200 steps
  // against no codec). KeptCount is n for the codecs that keep every value.
  const bool mask = use_feedback_ && worker_adam_ != nullptr && KeptCount(codec_, n) < n;
  if (on_device) {
    // The values, their residuals and the codec stay on the device; only
    // the payload comes back.
    return device_source_
        ->Encode(block->table, block->col_begin, block->width, rows, block->row_count, block->codec,
                 block->codec_seed, use_feedback_, mask, block->payload.data())
        .WithContext("table " + std::to_string(block->table) +
                     ": encoding the push on the model's device (a Corruption means the values "
                     "are not finite: training diverged?)");
  }
  if (use_feedback_)
    AddResidualOf(shard, key, rows, block->row_count, block->width, block->values.data());
  // The CPU's Decode writes every value (zeros included), so the buffer is
  // not zeroed first (a pass over memory as large as the block); the
  // device's encoder gets it zeroed.
  UninitVector<float> decoded(use_feedback_ ? n : 0);
  if (block_encoder_) std::fill(decoded.begin(), decoded.end(), 0.0f);
  // Our own bytes: they decode unless the values were not finite (a
  // diverged run), which the shard would refuse as well.
  const auto diverged = [&](const Status& status) {
    return status.WithContext("table " + std::to_string(block->table) +
                              ": the values to push do not encode (training diverged?)");
  };
  if (block_encoder_) {
    // The model's device: a refusal of the decode is as above; anything else
    // is the device's own failure, named as such.
    GRIDSYNC_RETURN_IF_ERROR(
        block_encoder_(block->codec, block->values.data(), n, block->codec_seed,
                       block->payload.data(), use_feedback_ ? decoded.data() : nullptr)
            .WithContext("table " + std::to_string(block->table) +
                         ": encoding the push on the model's device (a Corruption means the "
                         "values are not finite: training diverged?)"));
  } else {
    cpu::Encode(block->codec, block->values.data(), n, block->codec_seed, block->payload.data());
    if (use_feedback_) {
      GRIDSYNC_RETURN_IF_ERROR(
          diverged(cpu::Decode(block->codec, block->payload.data(), block->payload.size(), n,
                               block->codec_seed, decoded.data())));
    }
  }
  if (use_feedback_) {
    // Stored once the push is on its way (SettleAll): nothing reads these
    // residuals before, and the shards decode meanwhile.
    Settle& item = settle->emplace_back();
    item.key = key;
    item.table = block->table;
    item.col_begin = block->col_begin;
    item.width = block->width;
    if (block->dense) {
      item.rows = std::move(dense_rows);
    } else {
      item.rows = block->rows;  // the block's own may become a frame
    }
    item.corrected = std::move(block->values);
    item.decoded = std::move(decoded);
    item.mask = mask;
  }
  block->values.clear();
  return Status::OK();
}

Status PsClient::Push(wire::Kind kind, uint64_t step, const std::vector<TableRowsRef>& tables,
                      const std::function<void()>& while_acks) {
  const auto start = Clock::now();
  const bool updates = kind == wire::Kind::kPush && worker_adam_ != nullptr;
  std::vector<bool> on_device(partition_.n_tables(), false);
  bool any_on_device = false;
  for (const auto& ref : tables) {
    if (!ref.on_device) continue;
    if (device_source_ == nullptr || !device_tables_[ref.table] || kind != wire::Kind::kPush ||
        ref.dense) {
      return Status::InvalidArgument(
          "table " + std::to_string(ref.table) +
          ": a push of values on the model's device needs a DevicePushSource that owns the "
          "table, a push of the step and sparse rows");
    }
    on_device[ref.table] = any_on_device = true;
  }
  std::vector<TableRowsRef> refs = tables;
  if (updates && any_on_device) {
    // Adam on the device for its tables: their rows become updates there,
    // and only the rows that stepped are pushed.
    const ScopedSeconds timed(&counters_.adam_seconds);
    device_kept_.resize(partition_.n_tables());
    for (TableRowsRef& ref : refs) {
      if (!ref.on_device) continue;
      std::vector<uint32_t>& kept = device_kept_[ref.table];
      GRIDSYNC_RETURN_IF_ERROR(
          device_source_->ToUpdates(ref.table, ref.rows, ref.row_count, &kept)
              .WithContext("table " + std::to_string(ref.table) + ": Adam on the model's device"));
      worker_adam_->State(ref.table);  // it has state now, held on the device
      ref.rows = kept.data();
      ref.row_count = kept.size();
    }
  }
  std::vector<TableRowsRef> updated;
  if (updates) {
    const ScopedSeconds timed(&counters_.adam_seconds);
    updated = worker_adam_->ToUpdates(refs, pool_);
  }
  auto split = SplitAll(partition_, updates ? updated : refs, /*with_values=*/true);
  if (kind == wire::Kind::kPush && (codec_.codec != Codec::kNone || any_on_device)) {
    const ScopedSeconds timed(&counters_.codec_seconds);
    if (Status compressed = CompressAll(step, on_device, &split); !compressed.ok()) {
      SettleAll();  // what the blocks before the failure held back, as if sent
      return compressed;
    }
  }
  counters_.encode_seconds += Seconds(start);
  const bool settles = std::any_of(settle_.begin(), settle_.end(),
                                   [](const std::vector<Settle>& items) { return !items.empty(); });
  std::function<void()> after_send;
  if (settles || while_acks) {
    after_send = [this, settles, &while_acks] {
      if (settles) SettleAll();
      if (while_acks) while_acks();
    };
  }
  const Status status =
      SendAndAwaitAcks(kind, step, std::move(split), /*skip_step=*/false, after_send);
  counters_.push_seconds += Seconds(start);
  return status;
}

}  // namespace gridsync
