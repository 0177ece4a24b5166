package kfpipe

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/kf"
)

// TestMemoOnTheLease: Memo on the reply log the consumer uses (the
// partition's lease in real Redis). A handler uploads a picture, keeps its
// media_id with Memo and replies with it; the run is cut off while the
// reply is on its way (a consumer killed there). The re-run does not
// upload again and sends the image with the first upload's media_id, once.
func TestMemoOnTheLease(t *testing.T) {
	rig := newReplyRig(t)
	c := rig.message(t, rig.fake.AddText("wk", "u1", "send me the map"))
	var uploads atomic.Int32
	h := rig.wrap(adapt(HandlerFunc(func(ctx context.Context, m *Message) error {
		id, err := Memo(ctx, "map", func(ctx context.Context) (string, error) {
			kc, err := Client(ctx)
			if err != nil {
				return "", err
			}
			uploads.Add(1)
			return kc.UploadMedia(ctx, kf.MediaImage, "map.png", []byte("\x89PNG\r\n\x1a\n a map"))
		})
		if err != nil {
			return err
		}
		return Reply(ctx, kf.Image{MediaID: id})
	})))
	ctx, cancel := context.WithCancel(context.Background())
	var sends atomic.Int32
	cut := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/send_msg") || sends.Add(1) != 1 {
			return false
		}
		_, _ = io.Copy(io.Discard, r.Body)
		cancel()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			http.Error(w, "cut off", http.StatusBadGateway)
		}
		return true
	}
	rig.cut.Store(&cut)
	if err := h.Handle(ctx, c); err == nil {
		t.Fatal("the cut-off run succeeded")
	}
	rig.cut.Store(nil)
	for range 2 { // the re-run, and a redelivery after it finished
		if err := h.Handle(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if n := uploads.Load(); n != 1 {
		t.Fatalf("uploaded %d times over three runs, want 1", n)
	}
	got := rig.fake.Replies("wk", "u1")
	if len(got) != 1 || got[0].MsgType != "image" {
		t.Fatalf("delivered %v, want one image", got)
	}
	var img struct {
		MediaID string `json:"media_id"`
	}
	_ = json.Unmarshal(got[0].Body, &img)
	if !strings.HasPrefix(img.MediaID, "m-") {
		t.Fatalf("the image's media_id %q is not an upload's", img.MediaID)
	}
}
