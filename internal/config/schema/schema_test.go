package schema

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Ratio float64 `mapstructure:"ratio" default:"0.5" range:"(0, 1]"`
}

type off struct {
	On    bool `mapstructure:"on"`
	Count int  `mapstructure:"count" default:"3" range:"[1, 10]"`
}

func (o off) BoundsApply() bool { return o.On }

type item struct {
	Role string `mapstructure:"role" enum:"viewer|operator"`
}

type sample struct {
	Timeout time.Duration            `mapstructure:"timeout" default:"5s" range:"[1ms, 5m]"`
	Lease   time.Duration            `mapstructure:"lease" default:"Lease" range:"[1s, MaxLease]"`
	Standby time.Duration            `mapstructure:"standby" range:"[1s, 1h]" zero:"never"`
	Level   string                   `mapstructure:"level" default:"info" enum:"debug|info"`
	Size    int64                    `mapstructure:"size" default:"1_000" range:"[1000,]"`
	Flag    bool                     `mapstructure:"flag" default:"true"`
	Addrs   []string                 `mapstructure:"addrs" default:"a:1, b:2"`
	TTL     map[string]time.Duration `mapstructure:"ttl" range:"[1m,]"`
	Inner   inner                    `mapstructure:"inner"`
	Off     off                      `mapstructure:"off"`
	Items   []item                   `mapstructure:"items"`
	Groups  map[string]inner         `mapstructure:"groups"`
	hidden  int
}

var names = Names{"Lease": 10 * time.Second, "MaxLease": 24 * time.Hour}

func TestSetDefaults(t *testing.T) {
	s := sample{Timeout: time.Second}
	names.SetDefaults(&s)
	if s.Timeout != time.Second {
		t.Errorf("a set field took the default: %s", s.Timeout)
	}
	if s.Lease != 10*time.Second || s.Level != "info" || s.Size != 1000 || !s.Flag || s.Inner.Ratio != 0.5 || s.Off.Count != 3 {
		t.Errorf("defaults not applied: %+v", s)
	}
	if len(s.Addrs) != 2 || s.Addrs[1] != "b:2" {
		t.Errorf("addrs = %q", s.Addrs)
	}
	if s.Standby != 0 || s.hidden != 0 {
		t.Errorf("untagged fields changed: %+v", s)
	}
}

func TestSetDefaultsBadTagPanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "Timeout") {
			t.Fatalf("recover() = %v, want a panic naming the field", r)
		}
	}()
	var s struct {
		Timeout time.Duration `mapstructure:"timeout" default:"soon"`
	}
	names.SetDefaults(&s)
}

func TestCheck(t *testing.T) {
	valid := func() sample {
		var s sample
		names.SetDefaults(&s)
		return s
	}
	if err := names.Check("x", valid()); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	cases := []struct {
		edit func(*sample)
		want string // "" = accepted
	}{
		{func(s *sample) { s.Timeout = 10 * time.Minute }, "x.timeout must be in [1ms, 5m0s], got 10m0s"},
		{func(s *sample) { s.Timeout = 5 * time.Minute }, ""},
		{func(s *sample) { s.Lease = 25 * time.Hour }, "x.lease must be in [1s, 24h0m0s], got 25h0m0s"},
		{func(s *sample) { s.Standby = 0 }, ""},
		{func(s *sample) { s.Standby = time.Millisecond }, "x.standby must be 0 (never) or in [1s, 1h0m0s], got 1ms"},
		{func(s *sample) { s.Level = "loud" }, `x.level must be one of debug|info, got "loud"`},
		{func(s *sample) { s.Size = 999 }, "x.size must be >= 1000, got 999"},
		{func(s *sample) { s.TTL = map[string]time.Duration{"a": time.Second} }, "x.ttl.a must be >= 1m0s, got 1s"},
		{func(s *sample) { s.Inner.Ratio = 0 }, "x.inner.ratio must be in (0, 1], got 0"},
		{func(s *sample) { s.Inner.Ratio = 1 }, ""},
		{func(s *sample) { s.Off.Count = 0 }, ""}, // section off: not checked
		{func(s *sample) { s.Off.On, s.Off.Count = true, 0 }, "x.off.count must be in [1, 10], got 0"},
		{func(s *sample) { s.Items = []item{{"operator"}, {"root"}} }, `x.items[1].role must be one of viewer|operator, got "root"`},
		{func(s *sample) { s.Groups = map[string]inner{"g": {2}} }, "x.groups.g.ratio must be in (0, 1], got 2"},
	}
	for _, c := range cases {
		s := valid()
		c.edit(&s)
		err := names.Check("x", &s)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("refused: %v", err)
		case c.want != "" && (err == nil || err.Error() != c.want):
			t.Errorf("error = %v, want %q", err, c.want)
		}
	}
}

func TestCheckReportsEveryKey(t *testing.T) {
	var s sample
	names.SetDefaults(&s)
	s.Timeout, s.Size = 0, 0
	err := names.Check("", s)
	if err == nil || !strings.Contains(err.Error(), "timeout must") || !strings.Contains(err.Error(), "size must") {
		t.Fatalf("want both keys, got %v", err)
	}
}

func TestParseRangeRejectsMalformed(t *testing.T) {
	for _, tag := range []string{"1, 2", "[1 2]", "[1, x]", "[1, 2, 3]", "[NoSuchName, 2]"} {
		f := reflect.StructField{Name: "N", Type: reflect.TypeOf(0), Tag: reflect.StructTag(`range:"` + tag + `"`)}
		if _, _, err := names.ParseRange(f); err == nil {
			t.Errorf("range %q accepted", tag)
		}
	}
}
