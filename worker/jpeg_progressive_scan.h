// Whether a progressive JPEG's scans hold what they promise (the
// progressive half of jpeg_scan_check.h). stb_image 2.27 decodes a scan's
// data until it meets a marker and takes zero bits after it, and keeps
// whatever coefficients the scans it saw left: a photo cut short with an
// EOI put back (a hostile probe: the first 20% of a progressive file, then
// FF D9) trained on an image decoded partly from zeros, and one cut at a
// scan boundary on one missing its chroma and its fine detail.
//
// This walks every scan's Huffman codes block by block as a progressive
// decoder does (DC first and refinement scans, AC first scans with their
// end-of-band runs, AC refinement scans with their correction bits, which
// need to know which coefficients earlier scans made nonzero: a bit each),
// without dequantising or transforming, and refuses a scan whose data ends
// before its last block. At the end of the file every coefficient of every
// component must have been sent, down to its last bit of successive
// approximation. The standard lets a script stop short (libjpeg's
// validate_script allows it), but the default scripts of libjpeg, mozjpeg
// and jpegtran never do, and such a file cannot be told from one cut at a
// scan boundary, which decodes blurred or without colour: gridsync refuses
// it, saying so. A first DC scan clears its blocks in stb, AC included, so
// what earlier scans sent of them counts as unsent again. A scan using a
// Huffman table no DHT defined is refused (stb decodes it from a zeroed
// table). Damage stb itself refuses (a bad Huffman code, a scan header it
// calls corrupt) is left to stb: OK.
//
// Thread safety: a ProgressiveFrame is used by one thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/jpeg_bits.h"

namespace gridsync::jpeg_scan_check {

class ProgressiveFrame {
 public:
  struct Component {
    int id = 0, h = 1, v = 1;  // as SOF2 gives them
  };
  // One component of a scan: its index in the frame and its tables.
  struct ScanComponent {
    size_t index = 0;
    int dc = 0, ac = 0;
  };
  struct ScanHeader {
    std::vector<ScanComponent> components;
    int ss = 0, se = 0, ah = 0, al = 0;  // spectral selection, successive approximation
  };

  ProgressiveFrame(uint32_t width, uint32_t height, std::vector<Component> components);

  // Walks scan `number` (from 1), its data read from `bits`; `tables` are
  // [DC, AC][id], `restart_interval` in MCUs (0: none).
  Status Scan(int number, const ScanHeader& scan, const Huffman (&tables)[2][4],
              uint32_t restart_interval, Bits& bits);
  // At the end of the file: every coefficient of every component sent to
  // its last bit.
  Status Complete() const;

 private:
  // Blocks of component c when it is alone in a scan (its own size).
  uint64_t ComponentBlocks(size_t c) const;
  // One block of an AC scan; 1: walked, 0: the data ended, -1: corrupt.
  int AcFirstBlock(Bits& bits, const Huffman& ac, const ScanHeader& scan, uint64_t* nonzero);
  int AcRefineBlock(Bits& bits, const Huffman& ac, const ScanHeader& scan, uint64_t* nonzero);

  uint32_t width_, height_;
  std::vector<Component> components_;
  int h_max_ = 1, v_max_ = 1;
  // Per component: its blocks' nonzero AC coefficients (bit k: zig-zag
  // index k), made at its first AC scan; and per coefficient the lowest bit
  // sent so far (-1: none).
  std::vector<std::vector<uint64_t>> nonzero_;
  std::vector<std::array<int, 64>> lowest_bit_;
  uint32_t eob_run_ = 0;  // blocks left in an end-of-band run
  // Each scan walks every block of its components, here and in stb: 254
  // refinement scans of one end-of-band run each over a 16384 x 16384 grey
  // image (617 KB, within the scan cap) took 36 s to check and decode (a
  // hostile probe). The scans together may walk each block of the frame
  // kWalksPerBlock times (encoders' scripts: 4 to 6); under
  // kMinWalkBudget walks in all, any number (cheap whatever the script).
  static constexpr uint64_t kWalksPerBlock = 16;
  static constexpr uint64_t kMinWalkBudget = uint64_t{1} << 24;
  uint64_t frame_blocks_ = 0;  // of every component
  uint64_t walked_blocks_ = 0;
};

}  // namespace gridsync::jpeg_scan_check
