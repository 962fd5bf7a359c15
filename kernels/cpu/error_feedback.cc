// ErrorFeedback (error_feedback.h).
//
// Thread safety: see error_feedback.h.
#include "kernels/cpu/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/prefetch.h"
#include "common/row_width.h"
#include "common/state_bytes.h"

namespace gridsync::cpu {
namespace {

// Rows this far ahead have their residual prefetched: a step's rows are
// spread over tables far larger than the caches.
constexpr size_t kFeedbackPrefetch = 96;

// What RestoreState may allocate whatever the state's size (see there).
constexpr double kRestoreFloorBytes = 256.0 * (1 << 20);

}  // namespace

float* ErrorFeedback::Table::Insert(uint32_t row) {
  const size_t p = row >> kPageBits;
  if (p >= pages.size()) pages.resize(p + 1);
  Page& page = pages[p];
  if (!page.values) {
    page.present = std::make_unique<uint64_t[]>(kPageRows / 64);  // zeroed
    page.values = std::make_unique<float[]>(size_t{kPageRows} * width);
    ++pages_made;
  }
  const uint32_t i = row & (kPageRows - 1);
  uint64_t& word = page.present[i >> 6];
  const uint64_t bit = uint64_t{1} << (i & 63);
  if ((word & bit) == 0) {
    word |= bit;
    ++entries;
  }
  return page.values.get() + size_t{i} * width;
}

const ErrorFeedback::Table* ErrorFeedback::FindTable(uint64_t key) const {
  const auto it = tables_.find(key);
  return it == tables_.end() ? nullptr : &it->second;
}

void ErrorFeedback::AddResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                                float* values) const {
  const Table* t = FindTable(key);
  if (t == nullptr) return;
  GRIDSYNC_CHECK_EQ(t->width, width);
  WithRowWidth(width, [&](auto constant) {
    const uint32_t w = RowWidth(constant, width);
    for (size_t r = 0; r < n_rows; ++r) {
      if (r + kFeedbackPrefetch < n_rows) t->Prefetch(rows[r + kFeedbackPrefetch]);
      const float* residual = t->Find(rows[r]);
      if (residual == nullptr) continue;
      float* v = values + r * w;
      for (uint32_t f = 0; f < w; ++f) v[f] += residual[f];
    }
  });
}

bool ErrorFeedback::GatherResiduals(uint64_t key, const uint32_t* rows, uint32_t first_row,
                                    size_t n, uint32_t width, float* out) const {
  const Table* t = FindTable(key);
  if (t == nullptr || t->entries == 0) return false;
  GRIDSYNC_CHECK_EQ(t->width, width);
  WithRowWidth(width, [&](auto constant) {
    const uint32_t w = RowWidth(constant, width);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t row = rows != nullptr ? rows[i] : first_row + static_cast<uint32_t>(i);
      if (rows != nullptr && i + kFeedbackPrefetch < n) t->Prefetch(rows[i + kFeedbackPrefetch]);
      const float* residual = t->Find(row);
      float* o = out + i * w;
      if (residual == nullptr) {
        // -0.0f, the identity of addition for every float (+0.0f would
        // turn a -0.0f parameter into +0.0f): adding it changes no bit.
        for (uint32_t f = 0; f < w; ++f) o[f] = -0.0f;
      } else {
        for (uint32_t f = 0; f < w; ++f) o[f] = residual[f];
      }
    }
  });
  return true;
}

void ErrorFeedback::Assign(uint64_t key, uint32_t width, const uint32_t* rows, size_t n,
                           const float* values) {
  Reserve(key, width);
  ++epoch_;
  Table& t = tables_.at(key);
  for (size_t r = 0; r < n; ++r) std::copy_n(values + r * width, width, t.Insert(rows[r]));
}

void ErrorFeedback::CopyTableFrom(const ErrorFeedback& other, uint64_t key) {
  tables_.erase(key);
  ++epoch_;
  const Table* t = other.FindTable(key);
  if (t == nullptr) return;
  Table& mine = tables_[key];
  mine.width = t->width;
  for (uint32_t row : other.Rows(key)) std::copy_n(t->Find(row), t->width, mine.Insert(row));
}

std::vector<uint64_t> ErrorFeedback::Keys() const {
  std::vector<uint64_t> keys;
  for (const auto& [key, t] : tables_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

ErrorFeedback::Version ErrorFeedback::VersionOf(uint64_t key) const {
  const Table* t = FindTable(key);
  return {epoch_, t == nullptr ? UINT64_MAX : t->stores};
}

uint32_t ErrorFeedback::Width(uint64_t key) const {
  const Table* t = FindTable(key);
  return t == nullptr ? 0 : t->width;
}

void ErrorFeedback::Reserve(uint64_t key, uint32_t width) {
  GRIDSYNC_CHECK_GT(width, 0u);
  Table& t = tables_[key];
  if (t.width == 0) t.width = width;
  GRIDSYNC_CHECK_EQ(t.width, width);
}

void ErrorFeedback::StoreResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                                  const float* corrected, const float* decoded) {
  GRIDSYNC_CHECK_GT(width, 0u);
  // A lookup, not operator[], once the key exists: calls on distinct,
  // Reserved keys then never write the map itself (see Reserve).
  auto it = tables_.find(key);
  if (it == tables_.end()) it = tables_.emplace(key, Table{}).first;
  Table& t = it->second;
  if (t.width == 0) t.width = width;
  GRIDSYNC_CHECK_EQ(t.width, width);
  ++t.stores;
  WithRowWidth(width, [&](auto constant) {
    const uint32_t w = RowWidth(constant, width);
    for (size_t r = 0; r < n_rows; ++r) {
      if (r + kFeedbackPrefetch < n_rows) t.Prefetch(rows[r + kFeedbackPrefetch]);
      const float* c = corrected + r * w;
      const float* d = decoded + r * w;
      const uint32_t row = rows[r];
      float* residual = t.Find(row);
      if (residual == nullptr) {
        bool zero = true;
        for (uint32_t f = 0; f < w; ++f) zero &= (c[f] - d[f]) == 0.0f;
        if (zero) continue;  // no entry, and no page, for a zero residual
        residual = t.Insert(row);
      }
      for (uint32_t f = 0; f < w; ++f) residual[f] = c[f] - d[f];
    }
  });
}

void ErrorFeedback::AppendState(std::string* out) const {
  const std::vector<uint64_t> keys = Keys();
  AppendValue<uint64_t>(out, keys.size());
  for (uint64_t key : keys) {
    const Table& t = tables_.at(key);
    const std::vector<uint32_t> rows = Rows(key);
    AppendValue<uint64_t>(out, key);
    AppendValue<uint32_t>(out, t.width);
    AppendValue<uint64_t>(out, rows.size());
    out->append(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(uint32_t));
    for (uint32_t row : rows)
      out->append(reinterpret_cast<const char*>(t.Find(row)), t.width * sizeof(float));
  }
}

Status ErrorFeedback::RestoreState(std::string_view* in, const AdmitTable& admit) {
  tables_.clear();
  ++epoch_;
  const size_t state_bytes = in->size();
  const double allowed_bytes =
      std::max(kRestoreFloorBytes, 64.0 * static_cast<double>(state_bytes));
  double total_bytes = 0;  // pages and page index of the tables so far
  uint64_t n_keys = 0;
  if (!TakeValue(in, &n_keys)) return Status::Corruption("error feedback: no key count");
  for (uint64_t k = 0; k < n_keys; ++k) {
    uint64_t key = 0, count = 0;
    uint32_t width = 0;
    if (!TakeValue(in, &key) || !TakeValue(in, &width) || !TakeValue(in, &count) || width == 0 ||
        tables_.count(key) != 0) {
      return Status::Corruption("error feedback: a malformed or repeated table header");
    }
    std::vector<uint32_t> rows;
    std::vector<float> values;
    if (!TakeArray(in, count, &rows) || count > in->size() / sizeof(float) / width ||
        !TakeArray(in, count * width, &values)) {
      return Status::Corruption("error feedback: the state is shorter than its tables");
    }
    // A residual is what a codec held back of a bounded gradient: never
    // NaN or infinite, which would go into every later push of the row.
    const auto bad =
        std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
    if (bad != values.end()) {
      tables_.clear();
      const size_t at = static_cast<size_t>(bad - values.begin());
      return Status::Corruption("error feedback: table " + std::to_string(key >> 32) +
                                " (columns from " + std::to_string(key & 0xffffffffu) + "), row " +
                                std::to_string(rows[at / width]) + " holds the residual " +
                                std::to_string(*bad) + "; allowed: finite values");
    }
    const uint32_t max_row = rows.empty() ? 0 : *std::max_element(rows.begin(), rows.end());
    if (admit) {
      if (Status admitted = admit(key, width, max_row); !admitted.ok()) {
        tables_.clear();
        return admitted;
      }
    }
    // Pages are whole, and the index reaches the largest row: a state
    // listing one row per page, or one row far out, would make memory far
    // beyond its own size. A real one stays well inside this bound, which
    // holds for the tables together (each alone within it is not enough).
    std::vector<uint32_t> pages(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) pages[r] = rows[r] >> kPageBits;
    std::sort(pages.begin(), pages.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(pages.begin(), pages.end()) - pages.begin());
    const double index =
        rows.empty() ? 0.0 : static_cast<double>((max_row >> kPageBits) + 1) * sizeof(Page);
    total_bytes += static_cast<double>(distinct) * kPageRows * width * sizeof(float) + index;
    if (total_bytes > allowed_bytes) {
      tables_.clear();
      return Status::Corruption(
          "error feedback: with table " + std::to_string(key) + " (" + std::to_string(rows.size()) +
          " rows over " + std::to_string(distinct) + " pages of " + std::to_string(kPageRows) +
          " rows x " + std::to_string(width) + " floats, largest row " + std::to_string(max_row) +
          ") the state's residuals would take " +
          std::to_string(static_cast<uint64_t>(total_bytes)) +
          " bytes; allowed: at most 64 times the state's size (" + std::to_string(state_bytes) +
          " bytes) or 256 MiB, over all its tables");
    }
    Table& t = tables_[key];
    t.width = width;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (t.Find(rows[r]) != nullptr) {
        tables_.clear();
        return Status::Corruption("error feedback: table " + std::to_string(key) + " lists row " +
                                  std::to_string(rows[r]) + " twice; allowed: distinct rows");
      }
      std::copy_n(values.data() + r * width, width, t.Insert(rows[r]));
    }
  }
  return Status::OK();
}

size_t ErrorFeedback::Entries() const {
  size_t total = 0;
  for (const auto& [id, t] : tables_) total += t.entries;
  return total;
}

size_t ErrorFeedback::Entries(uint64_t key) const {
  const Table* t = FindTable(key);
  return t == nullptr ? 0 : t->entries;
}

const float* ErrorFeedback::Residual(uint64_t key, uint32_t row) const {
  const Table* t = FindTable(key);
  return t == nullptr ? nullptr : t->Find(row);
}

std::vector<uint32_t> ErrorFeedback::Rows(uint64_t key) const {
  std::vector<uint32_t> rows;
  const Table* t = FindTable(key);
  if (t == nullptr) return rows;
  rows.reserve(t->entries);
  for (size_t p = 0; p < t->pages.size(); ++p) {
    if (!t->pages[p].present) continue;
    for (uint32_t w = 0; w < kPageRows / 64; ++w) {
      for (uint64_t bits = t->pages[p].present[w]; bits != 0; bits &= bits - 1) {
        const auto bit = static_cast<uint32_t>(__builtin_ctzll(bits));
        rows.push_back(static_cast<uint32_t>((p << kPageBits) + w * 64 + bit));
      }
    }
  }
  return rows;
}

size_t ErrorFeedback::ResidualBytes() const {
  size_t bytes = 0;
  for (const auto& [id, t] : tables_) bytes += t.pages_made * kPageRows * t.width * sizeof(float);
  return bytes;
}

size_t ErrorFeedback::IndexBytes() const {
  size_t bytes = 0;
  for (const auto& [id, t] : tables_)
    bytes += t.pages.capacity() * sizeof(Page) + t.pages_made * kPageRows / 8;
  return bytes;
}

}  // namespace gridsync::cpu
