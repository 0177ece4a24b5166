package wecomtest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
)

// Inbound media, as WeChat serves it (media/get):
//
//   - GET /cgi-bin/media/get?access_token=…&media_id=…: the file, with its
//     Content-Type, Content-Length and a Content-Disposition naming the
//     file; errors are JSON in a 200 answer, as WeChat's.
//   - A Range header ("bytes=first-last", "bytes=first-") is honoured:
//     206 Partial Content with a Content-Range, as WeChat serves large
//     files (over 20 MB only in ranges); CutNextMediaBodies breaks
//     transfers off mid-body.
//   - A media_id lives 3 days (MediaTTL) from when the customer sent it:
//     afterwards, as for an id that never existed, the answer is errcode
//     40007 "invalid media_id". ExpireMedia ends one at once.
//
// AddMedia and AddImage append a customer's media message whose media_id
// media/get serves.

// MediaTTL is how long WeChat keeps a temporary media_id.
const MediaTTL = 72 * time.Hour

// mediaObject is one file media/get serves.
type mediaObject struct {
	data        []byte
	contentType string
	fileName    string
	created     time.Time
	expired     bool
}

// mediaState is the fake's media side (guarded by Server.mu).
type mediaState struct {
	objects map[string]*mediaObject
	gets    int
	fail    []int
	cuts    []int    // CutNextMediaBodies
	ranges  []string // the Range of each file served
}

func (s *Server) mediaSide() *mediaState {
	if s.media == nil {
		s.media = &mediaState{objects: map[string]*mediaObject{}}
	}
	return s.media
}

// AddImage appends a customer's image (a JPEG) and returns the message's
// msgid and the image's media_id.
func (s *Server) AddImage(openKfID, externalUserID string, data []byte) (msgID, mediaID string) {
	return s.AddMedia(openKfID, externalUserID, "image", "", "image/jpeg", data)
}

// AddMedia appends a customer's media message of msgType (image, voice,
// video or file) whose media/get answers data with contentType and
// fileName ("" ⇒ "<media_id>.<ext>", as WeChat names them), and returns
// its msgid and media_id. As in WeChat's sync_msg, the message carries
// only the media_id; the file's name comes with the download.
func (s *Server) AddMedia(openKfID, externalUserID, msgType, fileName, contentType string, data []byte) (msgID, mediaID string) {
	switch msgType {
	case "image", "voice", "video", "file":
	default:
		panic(fmt.Sprintf("wecomtest: AddMedia: %q is not a media type", msgType))
	}
	mediaID = s.PutMedia(fileName, contentType, data)
	raw, _ := json.Marshal(map[string]any{
		"open_kfid": openKfID, "external_userid": externalUserID, "origin": wecom.OriginCustomer,
		"msgtype": msgType, msgType: map[string]any{"media_id": mediaID},
	})
	return s.Append(openKfID, raw)[0], mediaID
}

// PutMedia makes media/get serve data with contentType and fileName (""
// ⇒ "<media_id>.<ext>") under a new media_id, valid MediaTTL, and
// returns it: the media of a message a test appends itself (AddMedia
// appends one).
func (s *Server) PutMedia(fileName, contentType string, data []byte) (mediaID string) {
	mediaID = "in-" + randHex(16)
	if fileName == "" {
		exts, _ := mime.ExtensionsByType(contentType)
		ext := ".bin"
		if len(exts) > 0 {
			ext = exts[0]
		}
		fileName = mediaID + ext
	}
	s.mu.Lock()
	s.mediaSide().objects[mediaID] = &mediaObject{data: append([]byte(nil), data...), contentType: contentType,
		fileName: fileName, created: s.opts.Clock()}
	s.mu.Unlock()
	return mediaID
}

// ExpireMedia makes media/get answer 40007 for mediaID from now on, as
// WeChat does 3 days after the message.
func (s *Server) ExpireMedia(mediaID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.mediaSide().objects[mediaID]; o != nil {
		o.expired = true
	}
}

// FailNextMediaGet makes the next n media/get calls answer errcode.
func (s *Server) FailNextMediaGet(n, errcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.mediaSide().fail = append(s.mediaSide().fail, errcode)
	}
}

// MediaGets is how many media/get requests the fake answered.
func (s *Server) MediaGets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mediaSide().gets
}

// getMedia answers media/get.
func (s *Server) getMedia(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	ms := s.mediaSide()
	ms.gets++
	if !s.authorize(w, r) {
		s.mu.Unlock()
		return
	}
	if len(ms.fail) > 0 {
		code := ms.fail[0]
		ms.fail = ms.fail[1:]
		s.mu.Unlock()
		writeErr(w, code, "injected")
		return
	}
	o := ms.objects[r.URL.Query().Get("media_id")]
	if o == nil || o.expired || !s.opts.Clock().Before(o.created.Add(MediaTTL)) {
		s.mu.Unlock()
		writeErr(w, 40007, "invalid media_id")
		return
	}
	cut := -1
	if len(ms.cuts) > 0 {
		cut, ms.cuts = ms.cuts[0], ms.cuts[1:]
	}
	ms.ranges = append(ms.ranges, r.Header.Get("Range"))
	s.mu.Unlock()
	h := w.Header()
	h.Set("Content-Type", o.contentType)
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": o.fileName}))
	h.Set("Cache-Control", "no-cache, must-revalidate")
	h.Set("Accept-Ranges", "bytes")
	data, status := o.data, http.StatusOK
	if v := r.Header.Get("Range"); v != "" {
		first, last, ok := parseRange(v, int64(len(o.data)))
		if !ok {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", len(o.data)))
			http.Error(w, "range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		data, status = o.data[first:last+1], http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, len(o.data)))
	}
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	if cut >= 0 && cut < len(data) {
		// The transfer breaks off: fewer bytes than announced, then the
		// connection closes.
		_, _ = w.Write(data[:cut])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler)
	}
	_, _ = w.Write(data)
}

// parseRange reads a single "bytes=first-last", "bytes=first-" or
// "bytes=-suffix" of a file of size bytes, as WeChat's media/get accepts;
// ok false when it does not fit the file.
func parseRange(v string, size int64) (first, last int64, ok bool) {
	spec, found := strings.CutPrefix(v, "bytes=")
	a, b, found2 := strings.Cut(spec, "-")
	if !found || !found2 || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	var err error
	if a == "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false
		}
		return max(size-n, 0), size - 1, size > 0
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil || first < 0 || first >= size {
		return 0, 0, false
	}
	last = size - 1
	if b != "" {
		if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
			return 0, 0, false
		}
		last = min(last, size-1)
	}
	return first, last, true
}

// CutNextMediaBodies makes the next media/get answers that serve a file
// (one per element of after) break off after that many bytes of their
// body, as a transfer cut by the network: the client sees fewer bytes
// than the Content-Length announced.
func (s *Server) CutNextMediaBodies(after ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mediaSide().cuts = append(s.mediaSide().cuts, after...)
}

// MediaRanges returns the Range header of every media/get that served a
// file, in order ("" for a request of the whole file).
func (s *Server) MediaRanges() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.mediaSide().ranges...)
}
