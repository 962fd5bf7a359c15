// Error feedback for the lossy codecs of kernels/cpu/codec.h: the part of a
// gradient that a codec did not deliver (corrected - decoded) is kept per
// (table, row) and added to the row's next gradient, so that over steps
// every row receives what it was owed.
//
// A residual is kept only for rows that were touched, and a row's residual is
// only ever added back when that row is touched again (or delivered whole
// by the final flush, PsClient::FlushResiduals, to rows that earned it).
// The reason: a sign codec such as onebit sends +-scale for every value it
// carries; if residual memory were dense, or were flushed into rows the step
// did not touch, those rows would receive +-scale pushes they never earned,
// and the shard's skip-untouched Adam (which leaves untouched rows' moments
// alone) would see them as touched and move them. Storing a zero residual
// for a row that has no entry is skipped, so lossless codecs cost no memory.
//
// Residuals lie in pages of 4096 rows, in row order, allocated when a row of
// the page first stores one, with a bit per row saying which rows hold an
// entry: a row's residual is one load away (the page pointers are few and
// stay cached), and rows that a step reads in ascending order read their
// residuals in order. Memory is per touched page, so a table whose pushes
// touch rows all over it ends with residual memory of its size (as the
// worker's parameters and Adam's moments have).
//
// A table's row width is fixed by its first StoreResidual; a later call with
// another width is a bug (checked).
//
// Thread safety: const calls may run concurrently; StoreResidual calls on
// distinct keys may run concurrently once each key is Reserved; anything
// else needs one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/prefetch.h"
#include "common/status.h"

namespace gridsync::cpu {

class ErrorFeedback {
 public:
  // Residuals are kept per key: one key per (table, column slice) the
  // caller pushes (64 bits, so no two slices can share one).
  // values (n_rows x width) += the stored residual of each row; rows with no
  // entry add nothing. Creates no entries.
  void AddResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                   float* values) const;
  // out (n x width) = the stored residual of each of rows[0..n) (or of rows
  // first_row.. when rows is null), -0.0f for a row with no entry (adding
  // it changes nothing, not even a zero's sign). Returns false, writing
  // nothing, when the key holds no entry at all.
  bool GatherResiduals(uint64_t key, const uint32_t* rows, uint32_t first_row, size_t n,
                       uint32_t width, float* out) const;
  // Makes the table of `key` (width floats a row) if it is missing, as the
  // first StoreResidual would: afterwards calls on distinct keys touch
  // distinct tables and may run on different threads at once.
  void Reserve(uint64_t key, uint32_t width);
  // residual(row) = corrected - decoded (both n_rows x width), for each row.
  // Rows must be distinct within a call.
  void StoreResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                     const float* corrected, const float* decoded);

  // Makes rows[0..n) entries of `key`'s table (width floats a row, as
  // Reserve) holding values (n x width), zero or not: how a copy of
  // residuals kept elsewhere (the model's device, DeviceTrainer::
  // CopyResidualsTo) is brought here entry for entry.
  void Assign(uint64_t key, uint32_t width, const uint32_t* rows, size_t n, const float* values);

  // Replaces `key`'s table with a copy of other's (none if other has none).
  void CopyTableFrom(const ErrorFeedback& other, uint64_t key);
  void Erase(uint64_t key) {
    tables_.erase(key);
    ++epoch_;
  }

  // The keys with a table (Reserved or stored), ascending, and a key's
  // width (0 when it has no table).
  std::vector<uint64_t> Keys() const;
  uint32_t Width(uint64_t key) const;
  // Rows holding a residual: over all tables, or in one.
  size_t Entries() const;
  size_t Entries(uint64_t key) const;
  // The row's `width` residual floats, or null when the row has no entry.
  const float* Residual(uint64_t key, uint32_t row) const;
  // The rows of `table` holding a residual, ascending.
  std::vector<uint32_t> Rows(uint64_t key) const;
  // Bytes held by residual values (whole pages).
  size_t ResidualBytes() const;
  // Bytes held by the index: page pointers and the rows' entry bits.
  size_t IndexBytes() const;
  void Clear() {
    tables_.clear();
    ++epoch_;
  }

  // Changes whenever `key`'s residuals may have changed: a store into its
  // table, or any call that adds, replaces or drops tables. A reader that
  // kept residuals it gathered compares versions to know they are still
  // what the table holds. StoreResidual calls on other keys leave it alone.
  struct Version {
    uint64_t epoch = 0;
    uint64_t stores = 0;
    bool operator==(const Version&) const = default;
  };
  Version VersionOf(uint64_t key) const;

  // Checkpoints (worker/worker_checkpoint.h): every residual, keys and rows
  // in ascending order, so a restored object equals the saved one.
  // RestoreState replaces everything and consumes its bytes from `in` (rows
  // in any order, as older checkpoints listed them by first touch);
  // Corruption on a malformed or short state, a residual that is not
  // finite, a row listed twice, or one whose pages and index would take
  // over 64 times its size (at least 256 MiB allowed) over all
  // its tables together. `admit`, when given, is asked about each table
  // (key, width, largest row) before anything of it is allocated, and its
  // error refuses the state: a state file is input, and a key or row no
  // table of the run has must not size memory first and be refused later.
  using AdmitTable = std::function<Status(uint64_t key, uint32_t width, uint32_t max_row)>;
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view* in, const AdmitTable& admit = nullptr);

 private:
  static constexpr uint32_t kPageBits = 12;
  static constexpr uint32_t kPageRows = 1u << kPageBits;
  struct Page {
    std::unique_ptr<uint64_t[]> present;  // kPageRows bits: rows holding an entry
    std::unique_ptr<float[]> values;      // kPageRows x width, zero where no entry
  };
  struct Table {
    uint32_t width = 0;
    size_t entries = 0;
    size_t pages_made = 0;
    uint64_t stores = 0;      // StoreResidual calls (see VersionOf)
    std::vector<Page> pages;  // by row >> kPageBits; empty until a row stores

    const float* Find(uint32_t row) const {
      const size_t p = row >> kPageBits;
      if (p >= pages.size() || !pages[p].values) return nullptr;
      const uint32_t i = row & (kPageRows - 1);
      if (((pages[p].present[i >> 6] >> (i & 63)) & 1) == 0) return nullptr;
      return pages[p].values.get() + size_t{i} * width;
    }
    float* Find(uint32_t row) {
      return const_cast<float*>(static_cast<const Table&>(*this).Find(row));
    }
    // Starts loading the row's residual (a hint; its page may be absent).
    void Prefetch(uint32_t row) const {
      const size_t p = row >> kPageBits;
      if (p < pages.size() && pages[p].values)
        PrefetchRow(pages[p].values.get() + size_t{row & (kPageRows - 1)} * width);
    }
    // The row's residual, made an entry (zero) if it was not one.
    float* Insert(uint32_t row);
  };
  const Table* FindTable(uint64_t key) const;
  std::unordered_map<uint64_t, Table> tables_;
  // Bumped by every call that adds, replaces or drops tables (StoreResidual
  // only adds to one): with a table's stores, its VersionOf.
  uint64_t epoch_ = 0;
};

}  // namespace gridsync::cpu
