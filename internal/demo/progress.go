package demo

import (
	"fmt"
	"io"
	"strings"
)

// bar draws a one-line progress bar with carriage returns; a nil writer
// draws nothing (not a terminal, or --quiet).
type bar struct {
	w     io.Writer
	drawn bool
}

func newBar(w io.Writer) *bar { return &bar{w: w} }

const barWidth = 30

func (b *bar) draw(done, total int, phase string) {
	if b.w == nil || total <= 0 {
		return
	}
	done = min(done, total)
	fill := barWidth * done / total
	fmt.Fprintf(b.w, "\r[%s%s] %3d%% %d/%d %-16s", strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill),
		100*done/total, done, total, phase)
	b.drawn = true
}

// done ends the bar's line.
func (b *bar) done() {
	if b.w != nil && b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}
