package console

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// memKafka is a Pipeline with a KafkaSource: it records the query it got.
type memKafka struct {
	memPipeline
	got RecordQuery
}

func (k *memKafka) KafkaContext(context.Context) (KafkaContext, error) {
	return KafkaContext{Brokers: []KafkaBroker{{ID: 1, Host: "b1", Port: 9092}},
		Topics: []KafkaTopic{{Role: "main", Name: "m", Group: "g", Partitions: []KafkaPartition{{Partition: 0, Leader: 1,
			Replicas: []int32{1}, ISR: []int32{1}, End: 10, Committed: 8, Lag: 2}}, LagTotal: 2},
			{Role: "dlq", Name: "d", Group: "gd", Error: "offsets of group gd: timed out"}}}, nil
}

func (k *memKafka) TopicRecords(_ context.Context, q RecordQuery) (RecordPage, error) {
	k.got = q
	return RecordPage{Topic: "m", Partition: 3, Records: []BrowsedRecord{{MainRecord: MainRecord{Offset: 5}, Key: q.User}}}, nil
}

// TestKafkaEndpoints: the Kafka card's answers come from the pipeline's
// KafkaSource; bad queries are 400 naming the field; without a source 503.
func TestKafkaEndpoints(t *testing.T) {
	src := &memKafka{}
	f := newFixtureWith(t, src)
	r := f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/kafka", "")
	var kc KafkaContext
	if r.status != 200 || json.Unmarshal(r.body, &kc) != nil || len(kc.Topics) != 2 || kc.Topics[1].Error == "" || kc.Brokers[0].Host != "b1" {
		t.Fatalf("GET /admin/kafka: %d %s", r.status, r.body)
	}
	r = f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/kafka/records?user=u1&since=2h&before=40&limit=5", "")
	if r.status != 200 || src.got.User != "u1" || src.got.Before != 40 || src.got.Limit != 5 || !src.got.Since.Equal(t0.Add(-2*time.Hour)) {
		t.Fatalf("records: %d %s, query %+v", r.status, r.body, src.got)
	}
	for q, field := range map[string]string{
		"":                        "user",
		"?msgid=x&before=3":       "before",
		"?user=u&before=-1":       "before",
		"?user=u&limit=0":         "limit",
		"?user=u&limit=201":       "limit",
		"?user=u&since=yesterday": "since",
	} {
		r := f.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/kafka/records"+q, "")
		if r.status != 400 || r.json(t)["field"] != field {
			t.Errorf("records%s: %d %s, want 400 on %s", q, r.status, r.body, field)
		}
	}
	g := newFixture(t)
	if r := g.do(t, "Bearer "+viewerToken, http.MethodGet, "/admin/kafka", ""); r.status != 503 {
		t.Errorf("without a source: %d %s", r.status, r.body)
	}
}
