#include "worker/jpeg_scan_check.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "worker/image_task.h"
#include "worker/jpeg_bits.h"
#include "worker/jpeg_progressive_scan.h"

namespace gridsync::jpeg_scan_check {
namespace {

constexpr int kMaxProgressiveScans = 256;

// Past a scan's data, from `pos`, to the next marker: an FF neither stuffed
// (FF 00) nor a restart (FF D0-D7). Fill bytes (FF FF) before it are left
// to the caller's loop, which skips them.
size_t NextMarker(const uint8_t* data, size_t size, size_t pos) {
  while (pos + 1 < size && !(data[pos] == 0xFF && data[pos + 1] != 0x00 &&
                             (data[pos + 1] < 0xD0 || data[pos + 1] > 0xD7))) {
    ++pos;
  }
  return pos;
}

struct Component {
  int id = 0, h = 1, v = 1;
  int dc = 0, ac = 0;  // table selectors of the current scan
};

// One block: a DC difference, then AC codes up to EOB or the 64th
// coefficient. 1: decoded; 0: the data ended; -1: a code stb refuses.
int Block(Bits& bits, const Huffman& dc, const Huffman& ac) {
  const int s = bits.Decode(dc);
  if (s < 0) return s == -1 ? 0 : -1;
  if (s > 15) return -1;  // stb: "bad huffman code"
  if (!bits.Skip(s)) return 0;
  for (int k = 1; k < 64;) {
    const int rs = bits.Decode(ac);
    if (rs < 0) return rs == -1 ? 0 : -1;
    const int r = rs >> 4, size = rs & 15;
    if (size == 0) {
      if (r != 15) break;  // EOB
      k += 16;
      continue;
    }
    k += r;
    if (!bits.Skip(size)) return 0;
    ++k;
  }
  return 1;
}

}  // namespace

Status CheckScans(const uint8_t* data, size_t size, size_t pos) {
  Huffman tables[2][4];  // [DC, AC][id]
  std::vector<Component> frame;
  uint32_t width = 0, height = 0, restart_interval = 0;
  int scans = 0;
  bool progressive = false;
  // Frame components some scan decodes (progressive: a first DC scan): stb
  // converts the others from buffers nothing wrote.
  std::vector<bool> covered;
  std::optional<ProgressiveFrame> progressive_frame;  // its scans' state
  const auto all_covered = [&]() -> Status {
    for (size_t c = 0; c < frame.size(); ++c) {
      if (c < covered.size() && covered[c]) continue;
      return Status::InvalidArgument(
          "JPEG component " + std::to_string(frame[c].id) + " of " + std::to_string(frame.size()) +
          " is in no " + (progressive ? "first DC scan" : "scan") + " (nothing to decode it from)");
    }
    return progressive_frame ? progressive_frame->Complete() : Status::OK();
  };
  while (pos + 4 <= size) {
    if (data[pos] != 0xFF) {  // bytes between segments, which stb skips too
      ++pos;
      continue;
    }
    const uint8_t marker = data[pos + 1];
    if (marker == 0xFF) {
      ++pos;
      continue;
    }
    if (marker == 0xD9) return all_covered();  // EOI
    const size_t length = size_t{data[pos + 2]} << 8 | data[pos + 3];
    const size_t begin = pos + 4, end = pos + 2 + length;
    if (length < 2 || end > size) return Status::OK();
    if (marker >= 0xC3 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      return Status::OK();  // processes stb does not decode: refused elsewhere
    }
    if (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) {
      progressive = marker == 0xC2;
      if (length < 8) return Status::OK();
      height = uint32_t{data[begin + 1]} << 8 | data[begin + 2];
      width = uint32_t{data[begin + 3]} << 8 | data[begin + 4];
      const int n = data[begin + 5];
      frame.clear();
      for (int c = 0; c < n && begin + 6 + 3 * c + 3 <= end; ++c) {
        const uint8_t* p = data + begin + 6 + 3 * c;
        frame.push_back({p[0], std::max(1, p[1] >> 4), std::max(1, p[1] & 15)});
      }
      covered.assign(frame.size(), false);
      progressive_frame.reset();
      // Past ImageTask's pixel bound the size is refused by name after this
      // check; the walk would keep 8 bytes a block for nothing.
      if (progressive && uint64_t{width} * height > ImageTask::kMaxPixels) return Status::OK();
      // Frames stb refuses ("bad component count", "bad H", "bad V"): left
      // to it, before the walk keeps a bit set per block of 255 components.
      const bool stb_frame = (frame.size() == 1 || frame.size() == 3 || frame.size() == 4) &&
                             std::all_of(frame.begin(), frame.end(),
                                         [](const Component& c) { return c.h <= 4 && c.v <= 4; });
      if (progressive && !stb_frame) return Status::OK();
      if (progressive) {
        std::vector<ProgressiveFrame::Component> shapes;
        for (const auto& c : frame) shapes.push_back({c.id, c.h, c.v});
        progressive_frame.emplace(width, height, std::move(shapes));
      }
    } else if (marker == 0xC4) {
      for (size_t at = begin; at + 17 <= end;) {
        const int cls = data[at] >> 4, id = data[at] & 15;
        size_t n = 0;
        for (int i = 1; i <= 16; ++i) n += data[at + i];
        if (cls > 1 || id > 3 || at + 17 + n > end) return Status::OK();
        tables[cls][id] = BuildHuffman(data + at + 1, data + at + 17, n);
        at += 17 + n;
      }
    } else if (marker == 0xDD && length >= 4) {
      restart_interval = uint32_t{data[begin]} << 8 | data[begin + 1];
    } else if (marker == 0xDA) {
      if (frame.empty() || width == 0 || height == 0 || length < 3) return Status::OK();
      const int n = data[begin];
      if (begin + 1 + 2 * size_t(n) + 3 > end) return Status::OK();
      // Spectral selection and successive approximation.
      const uint8_t ss = data[begin + 1 + 2 * n], se = data[begin + 2 + 2 * n];
      const uint8_t ah = data[begin + 3 + 2 * n] >> 4, al = data[begin + 3 + 2 * n] & 15;
      ProgressiveFrame::ScanHeader header{{}, ss, se, ah, al};
      std::vector<Component*> in_scan;
      for (int c = 0; c < n; ++c) {
        const uint8_t* p = data + begin + 1 + 2 * c;
        auto it = std::find_if(frame.begin(), frame.end(),
                               [&](const Component& f) { return f.id == p[0]; });
        if (it == frame.end()) return Status::OK();
        if (!progressive || (ss == 0 && ah == 0)) covered[size_t(it - frame.begin())] = true;
        it->dc = p[1] >> 4;
        it->ac = p[1] & 15;
        if (progressive) {
          if (it->dc > 3 || it->ac > 3) return Status::OK();
          header.components.push_back({size_t(it - frame.begin()), it->dc, it->ac});
          continue;
        }
        if (it->dc > 3 || it->ac > 3) return Status::OK();  // stb: "bad DC huff"
        // stb decodes from an empty (zeroed) table: a flat grey image.
        if (!tables[0][it->dc].defined || !tables[1][it->ac].defined) {
          return Status::InvalidArgument(
              "JPEG scan " + std::to_string(scans + 1) + " uses Huffman table " +
              (tables[0][it->dc].defined ? "AC " + std::to_string(it->ac)
                                         : "DC " + std::to_string(it->dc)) +
              ", which no DHT before it defines (a Motion-JPEG frame relying on the standard "
              "tables is not supported)");
        }
        in_scan.push_back(&*it);
      }
      if (progressive) {
        // Each scan walks every block of its components; encoders write
        // about ten. stb has no bound, so a file of thousands of scans of
        // end-of-band runs would cost minutes here and in stb.
        if (++scans > kMaxProgressiveScans) {
          return Status::InvalidArgument(
              "progressive JPEG of more than " + std::to_string(kMaxProgressiveScans) +
              " scans; allowed: at most " + std::to_string(kMaxProgressiveScans));
        }
        Bits bits(data, size, end);
        GRIDSYNC_RETURN_IF_ERROR(
            progressive_frame->Scan(scans, header, tables, restart_interval, bits));
        pos = NextMarker(data, size, std::max(end, bits.pos()));
        continue;
      }
      if (in_scan.empty()) return Status::OK();
      int h_max = 1, v_max = 1;
      for (const auto& c : frame) {
        h_max = std::max(h_max, c.h);
        v_max = std::max(v_max, c.v);
      }
      // MCUs and the blocks of each: interleaved, each component's h x v;
      // one component alone, its own blocks one at a time.
      uint64_t mcus = 0;
      if (in_scan.size() == 1) {
        const Component& c = *in_scan[0];
        const uint64_t w = (uint64_t{width} * c.h + h_max - 1) / h_max;
        const uint64_t hh = (uint64_t{height} * c.v + v_max - 1) / v_max;
        mcus = ((w + 7) / 8) * ((hh + 7) / 8);
      } else {
        mcus = ((width + 8 * h_max - 1) / (8 * h_max)) *
               uint64_t{(height + 8 * v_max - 1) / (8 * v_max)};
      }
      ++scans;
      Bits bits(data, size, end);
      for (uint64_t m = 0; m < mcus; ++m) {
        // stb stops at a missing restart marker and keeps what it decoded.
        if (restart_interval > 0 && m > 0 && m % restart_interval == 0 && !bits.Restart()) {
          return Status::InvalidArgument("JPEG scan " + std::to_string(scans) + " holds " +
                                         std::to_string(m) + " of " + std::to_string(mcus) +
                                         " MCUs (no restart marker after MCU " + std::to_string(m) +
                                         "; truncated or corrupt)");
        }
        for (const Component* c : in_scan) {
          const int blocks = in_scan.size() == 1 ? 1 : c->h * c->v;
          for (int b = 0; b < blocks; ++b) {
            const int decoded = Block(bits, tables[0][c->dc], tables[1][c->ac]);
            // A code the table lacks, or a DC size past 15: stb refuses the
            // file too, but on its way there shifts by 32 bits (undefined
            // behaviour, image_decode_fuzz), so it is refused here first.
            if (decoded < 0) {
              return Status::InvalidArgument("JPEG scan " + std::to_string(scans) + " MCU " +
                                             std::to_string(m) +
                                             ": a Huffman code its table does not hold "
                                             "(corrupt)");
            }
            if (decoded == 0) {
              return Status::InvalidArgument("JPEG scan " + std::to_string(scans) + " holds " +
                                             std::to_string(m) + " of " + std::to_string(mcus) +
                                             " MCUs (its coded data ends at byte " +
                                             std::to_string(bits.pos()) + "; truncated)");
            }
          }
        }
      }
      pos = NextMarker(data, size, bits.pos());
      continue;
    }
    pos = end;
  }
  return all_covered();
}

}  // namespace gridsync::jpeg_scan_check
