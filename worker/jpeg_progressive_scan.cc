#include "worker/jpeg_progressive_scan.h"

#include <algorithm>
#include <bit>
#include <string>

namespace gridsync::jpeg_scan_check {
namespace {

// What a block's walk returned, read as the caller's answer.
constexpr int kWalked = 1, kEnded = 0, kCorrupt = -1;

int Ended(int decoded) { return decoded == -1 ? kEnded : kCorrupt; }

// An end-of-band run of class r (< 15): the blocks after this one it
// covers, (1 << r) - 1 + r more bits; false when the data ended.
bool ReadEobRun(Bits& bits, int r, uint32_t* run) {
  uint32_t more = (1u << r) - 1;
  for (int i = r - 1; i >= 0; --i) {
    const int bit = bits.Bit();
    if (bit < 0) return false;
    more += static_cast<uint32_t>(bit) << i;
  }
  *run = more;
  return true;
}

std::string Bands(const ProgressiveFrame::ScanHeader& scan) {
  return (scan.ss == 0 ? std::string("DC")
                       : "AC " + std::to_string(scan.ss) + "-" + std::to_string(scan.se)) +
         (scan.ah == 0 ? ", first" : ", refining") + " to bit " + std::to_string(scan.al);
}

}  // namespace

ProgressiveFrame::ProgressiveFrame(uint32_t width, uint32_t height,
                                   std::vector<Component> components)
    : width_(width), height_(height), components_(std::move(components)) {
  for (const auto& c : components_) {
    h_max_ = std::max(h_max_, c.h);
    v_max_ = std::max(v_max_, c.v);
  }
  nonzero_.resize(components_.size());
  std::array<int, 64> none;
  none.fill(-1);
  lowest_bit_.assign(components_.size(), none);
  for (size_t c = 0; c < components_.size(); ++c) frame_blocks_ += ComponentBlocks(c);
}

uint64_t ProgressiveFrame::ComponentBlocks(size_t c) const {
  const uint64_t w = (uint64_t{width_} * components_[c].h + h_max_ - 1) / h_max_;
  const uint64_t h = (uint64_t{height_} * components_[c].v + v_max_ - 1) / v_max_;
  return ((w + 7) / 8) * ((h + 7) / 8);
}

int ProgressiveFrame::AcFirstBlock(Bits& bits, const Huffman& ac, const ScanHeader& scan,
                                   uint64_t* nonzero) {
  if (eob_run_ > 0) {
    --eob_run_;
    return kWalked;
  }
  for (int k = scan.ss; k <= scan.se;) {
    const int rs = bits.Decode(ac);
    if (rs < 0) return Ended(rs);
    const int r = rs >> 4, s = rs & 15;
    if (s == 0) {
      if (r < 15) {  // an end-of-band run: this block and more
        if (!ReadEobRun(bits, r, &eob_run_)) return kEnded;
        break;
      }
      k += 16;  // sixteen zeros
      continue;
    }
    k += r;
    int32_t magnitude = 0;
    if (!bits.Value(s, &magnitude)) return kEnded;
    // The coefficient as stb stores it: extended, shifted by al, in a
    // short (which a large al can wrap to 0); a run past 63 lands on 63
    // (stb's de-zig-zag table is padded with 63s).
    const int32_t extended = magnitude < (1 << (s - 1)) ? magnitude - (1 << s) + 1 : magnitude;
    const auto stored = static_cast<int16_t>(extended * (1 << scan.al));
    if (stored != 0) *nonzero |= uint64_t{1} << std::min(k, 63);
    ++k;
  }
  return kWalked;
}

int ProgressiveFrame::AcRefineBlock(Bits& bits, const Huffman& ac, const ScanHeader& scan,
                                    uint64_t* nonzero) {
  // A correction bit for each coefficient already nonzero in [from, se]
  // (counted at once: a long end-of-band run costs a step a block).
  auto corrections = [&](int from) {
    if (from > scan.se) return true;
    const uint64_t upto = scan.se == 63 ? ~uint64_t{0} : (uint64_t{1} << (scan.se + 1)) - 1;
    const uint64_t band = upto & ~((uint64_t{1} << from) - 1);
    return bits.Skip(std::popcount(*nonzero & band));
  };
  if (eob_run_ > 0) {
    --eob_run_;
    return corrections(scan.ss) ? kWalked : kEnded;
  }
  int k = scan.ss;
  while (k <= scan.se) {
    const int rs = bits.Decode(ac);
    if (rs < 0) return Ended(rs);
    int r = rs >> 4;
    const int s = rs & 15;
    if (s == 0) {
      if (r < 15) {  // end of band: the rest of this block's corrections, then the run
        if (!ReadEobRun(bits, r, &eob_run_)) return kEnded;
        return corrections(k) ? kWalked : kEnded;
      }
      // r == 15: sixteen zeros skipped (the loop below places a zero).
    } else {
      if (s != 1) return kCorrupt;        // stb: "bad huffman code"
      if (bits.Bit() < 0) return kEnded;  // the new coefficient's sign
    }
    // Past r zero coefficients, correcting the nonzero ones on the way;
    // the new coefficient (if any) goes at the next zero.
    while (k <= scan.se) {
      const int at = k++;
      if ((*nonzero >> at & 1) != 0) {
        if (bits.Bit() < 0) return kEnded;
      } else {
        if (r == 0) {
          if (s != 0) *nonzero |= uint64_t{1} << at;
          break;
        }
        --r;
      }
    }
  }
  return kWalked;
}

Status ProgressiveFrame::Scan(int number, const ScanHeader& scan, const Huffman (&tables)[2][4],
                              uint32_t restart_interval, Bits& bits) {
  // Headers stb refuses itself ("bad SOS", "can't merge dc and ac").
  if (scan.components.empty() || scan.ss > scan.se || scan.se > 63 || scan.ah > 13 ||
      scan.al > 13 || (scan.ss == 0 && scan.se != 0) ||
      (scan.ss > 0 && scan.components.size() != 1)) {
    return Status::OK();
  }
  for (const auto& sc : scan.components) {
    if (sc.index >= components_.size()) return Status::OK();
    // stb decodes from an empty (zeroed) table, whatever the data says.
    const bool dc_missing = scan.ss == 0 && scan.ah == 0 && !tables[0][sc.dc].defined;
    if (dc_missing || (scan.ss > 0 && !tables[1][sc.ac].defined)) {
      return Status::InvalidArgument(
          "JPEG progressive scan " + std::to_string(number) + " (" + Bands(scan) +
          ") uses Huffman table " +
          (dc_missing ? "DC " + std::to_string(sc.dc) : "AC " + std::to_string(sc.ac)) +
          ", which no DHT before it defines (a Motion-JPEG frame relying on the standard "
          "tables is not supported)");
    }
  }
  // A first DC scan clears its blocks in stb, AC coefficients included:
  // whatever earlier scans sent of them is gone.
  if (scan.ss == 0 && scan.ah == 0) {
    for (const auto& sc : scan.components) {
      std::fill(lowest_bit_[sc.index].begin() + 1, lowest_bit_[sc.index].end(), -1);
      std::fill(nonzero_[sc.index].begin(), nonzero_[sc.index].end(), 0);
    }
  }
  // What the scan sends: its band, from bit ah down to al (a refinement
  // counts only where the bits before it were sent).
  for (const auto& sc : scan.components) {
    for (int k = scan.ss; k <= scan.se; ++k) {
      int& lowest = lowest_bit_[sc.index][static_cast<size_t>(k)];
      if (scan.ah == 0 || lowest == scan.ah) lowest = scan.al;
    }
  }

  const bool interleaved = scan.components.size() > 1;
  const uint64_t mcus = interleaved ? ((width_ + 8 * h_max_ - 1) / (8 * h_max_)) *
                                          uint64_t{(height_ + 8 * v_max_ - 1) / (8 * v_max_)}
                                    : ComponentBlocks(scan.components[0].index);
  // What this scan walks (here and in stb), against the budget.
  uint64_t walks = 0;
  for (const auto& sc : scan.components) {
    walks += interleaved
                 ? mcus * static_cast<uint64_t>(components_[sc.index].h * components_[sc.index].v)
                 : mcus;
  }
  walked_blocks_ += walks;
  if (walked_blocks_ > kMinWalkBudget && walked_blocks_ > kWalksPerBlock * frame_blocks_) {
    return Status::InvalidArgument(
        "progressive JPEG whose scans walk its " + std::to_string(frame_blocks_) +
        " blocks more than " + std::to_string(kWalksPerBlock) + " times over (" +
        std::to_string(walked_blocks_) + " block walks by scan " + std::to_string(number) +
        "; each costs its decoding again); allowed: at most " + std::to_string(kWalksPerBlock) +
        " walks a block (encoders' scripts walk each 4 to 6 times)");
  }
  std::vector<uint64_t>* nonzero = nullptr;
  if (scan.ss > 0) {
    nonzero = &nonzero_[scan.components[0].index];
    if (nonzero->empty()) nonzero->assign(mcus, 0);
  }
  const auto where = [&](uint64_t m) {
    return "JPEG progressive scan " + std::to_string(number) + " (" + Bands(scan) + ") holds " +
           std::to_string(m) + " of " + std::to_string(mcus) + (interleaved ? " MCUs" : " blocks");
  };
  eob_run_ = 0;
  for (uint64_t m = 0; m < mcus; ++m) {
    // stb stops at a missing restart marker and keeps what it decoded.
    if (restart_interval > 0 && m > 0 && m % restart_interval == 0) {
      if (!bits.Restart()) {
        return Status::InvalidArgument(where(m) + " (no restart marker after " + std::to_string(m) +
                                       "; truncated or corrupt)");
      }
      eob_run_ = 0;
    }
    int walked = kWalked;
    for (const auto& sc : scan.components) {
      const int blocks = interleaved ? components_[sc.index].h * components_[sc.index].v : 1;
      for (int b = 0; b < blocks && walked == kWalked; ++b) {
        if (scan.ss > 0) {
          walked = scan.ah == 0 ? AcFirstBlock(bits, tables[1][sc.ac], scan, &(*nonzero)[m])
                                : AcRefineBlock(bits, tables[1][sc.ac], scan, &(*nonzero)[m]);
        } else if (scan.ah == 0) {
          const int s = bits.Decode(tables[0][sc.dc]);
          walked = s < 0 ? Ended(s) : s > 15 ? kCorrupt : bits.Skip(s) ? kWalked : kEnded;
        } else {
          walked = bits.Bit() < 0 ? kEnded : kWalked;
        }
      }
    }
    // A code the table lacks: stb refuses the file too, but walking on
    // would read past what it decodes, so it is refused here first.
    if (walked == kCorrupt) {
      return Status::InvalidArgument("JPEG progressive scan " + std::to_string(number) + " (" +
                                     Bands(scan) + "), " + (interleaved ? "MCU " : "block ") +
                                     std::to_string(m) +
                                     ": a Huffman code its table does not hold (corrupt)");
    }
    if (walked == kEnded) {
      return Status::InvalidArgument(where(m) + " (its coded data ends at byte " +
                                     std::to_string(bits.pos()) + "; truncated)");
    }
  }
  return Status::OK();
}

Status ProgressiveFrame::Complete() const {
  for (size_t c = 0; c < components_.size(); ++c) {
    // The first coefficient short of its last bit, and how far the run of
    // such coefficients goes: "coefficients 6-63 ... never sent".
    for (int k = 0; k < 64; ++k) {
      const int lowest = lowest_bit_[c][static_cast<size_t>(k)];
      if (lowest == 0) continue;
      int last = k;
      while (last + 1 < 64 && lowest_bit_[c][static_cast<size_t>(last + 1)] == lowest) ++last;
      const std::string which =
          (k == last ? "coefficient " + std::to_string(k)
                     : "coefficients " + std::to_string(k) + "-" + std::to_string(last)) +
          " (zig-zag order) of component " + std::to_string(components_[c].id);
      return Status::InvalidArgument(
          "progressive JPEG ends before its scans sent " + which +
          (lowest < 0 ? ": never sent" : " below bit " + std::to_string(lowest)) +
          " (a file cut at a scan boundary decodes blurred or without colour; allowed: a "
          "progressive JPEG whose scans send every coefficient to its last bit, as encoders "
          "write them, or a baseline one)");
    }
  }
  return Status::OK();
}

}  // namespace gridsync::jpeg_scan_check
