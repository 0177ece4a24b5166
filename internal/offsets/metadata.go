package offsets

import (
	"fmt"
	"strconv"
	"strings"
)

// The finished offsets behind an unfinished one travel with the committed
// offset, in the commit's metadata string, so that the partition's next
// owner does not run them again: a commit carries "next" (the first offset
// to read) and the offsets after it that are already finished. Without
// them, one slow or stuck message makes the next owner re-run everything
// finished behind it — effects whose done marks may not have landed (a
// Redis outage) and whose claims may have expired. Confluent's Parallel
// Consumer keeps its incomplete offsets in the same place for the same
// reason.
//
// The format is metaPrefix followed by comma-separated ranges of offsets
// relative to next ("d" or "d1-d2", d ≥ 1): "kfpipe1:1-3,7" after next 100
// means 101, 102, 103 and 107 are finished. An empty list encodes as "".

const metaPrefix = "kfpipe1:"

// MaxMetadata is the longest metadata EncodeFinished writes: below the
// broker's default offset.metadata.max.bytes (4096), which refuses the
// whole commit when exceeded.
const MaxMetadata = 4000

// EncodeFinished encodes the finished offsets done (ascending, all > next)
// as commit metadata of at most max bytes. When they do not all fit, the
// ranges that fit are kept (the earliest ones) and truncated is true: the
// rest are read again by the next owner, as they would be without
// metadata.
func EncodeFinished(next int64, done []int64, max int) (meta string, truncated bool) {
	if len(done) == 0 {
		return "", false
	}
	var b strings.Builder
	b.WriteString(metaPrefix)
	for i := 0; i < len(done); {
		j := i
		for j+1 < len(done) && done[j+1] == done[j]+1 {
			j++
		}
		var r string
		if d := done[i] - next; j == i {
			r = strconv.FormatInt(d, 10)
		} else {
			r = strconv.FormatInt(d, 10) + "-" + strconv.FormatInt(done[j]-next, 10)
		}
		sep := 0
		if i > 0 {
			sep = 1
		}
		if b.Len()+sep+len(r) > max {
			if i == 0 {
				return "", true
			}
			return b.String(), true
		}
		if sep == 1 {
			b.WriteByte(',')
		}
		b.WriteString(r)
		i = j + 1
	}
	return b.String(), false
}

// DecodeFinished returns the offsets meta (written by EncodeFinished for a
// commit at next) lists, ascending. Metadata written by someone else (an
// offset reset tool, an older version: anything without the prefix) lists
// nothing; malformed kfpipe metadata is an error.
func DecodeFinished(next int64, meta string) ([]int64, error) {
	rest, ok := strings.CutPrefix(meta, metaPrefix)
	if !ok || rest == "" {
		return nil, nil
	}
	var out []int64
	last := int64(0)
	for _, r := range strings.Split(rest, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("offset metadata %q: range %q: %w", meta, r, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil {
				return nil, fmt.Errorf("offset metadata %q: range %q: %w", meta, r, err)
			}
		}
		if a <= last || b < a {
			return nil, fmt.Errorf("offset metadata %q: range %q is not ascending after %d", meta, r, last)
		}
		if b-a > 1<<20 {
			return nil, fmt.Errorf("offset metadata %q: range %q is too long", meta, r)
		}
		for d := a; d <= b; d++ {
			out = append(out, next+d)
		}
		last = b
	}
	return out, nil
}
