// SPDX-License-Identifier: Apache-2.0

// Package ocsf validates OCSF events against the OCSF project's own schema
// files: the pinned copy in schema/ (SOURCE names the release, refresh-
// schema.sh re-creates it). A class or object is compiled the way the OCSF
// server compiles it: it takes the attributes of what it extends, then of
// the profiles it $includes (marked with the profile), then its own; each
// attribute takes its type, array-ness, sibling and enum from the
// dictionary where the definition does not say. The OCSF project's Python
// ocsf-validator (PyPI) is out of reach from gpufence's CI, hence this.
package ocsf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
)

type ocsfAttr struct {
	Type        string
	IsArray     bool
	Requirement string
	Sibling     string
	Enum        map[string]string // id -> caption
	Profile     string            // "" when the attribute is no profile's
	Deprecated  bool
}

type ocsfDef struct {
	Name        string
	Caption     string
	Category    string
	UID         int
	Attrs       map[string]*ocsfAttr
	AtLeastOne  [][]string
	JustOne     [][]string
	Generic     bool // "object": any members
	IsClass     bool
	ClassUID    int
	CategoryUID int
}

// Schema is a compiled OCSF schema.
type Schema struct {
	dir        string
	dict       map[string]*ocsfAttr
	types      map[string]ocsfBaseType
	categories map[string]struct {
		UID     int
		Caption string
	}
	files   map[string]map[string]string // kind (events, objects) -> name -> file
	cache   map[string]*ocsfDef
	classes map[int]*ocsfDef
}

type ocsfBaseType struct {
	Type  string
	Regex string
	Range []float64
}

type rawAttr struct {
	Caption     *string                    `json:"caption"`
	Type        *string                    `json:"type"`
	IsArray     *bool                      `json:"is_array"`
	Requirement *string                    `json:"requirement"`
	Sibling     *string                    `json:"sibling"`
	Enum        map[string]json.RawMessage `json:"enum"`
	Profile     json.RawMessage            `json:"profile"`
	Deprecated  json.RawMessage            `json:"@deprecated"`
}

type rawDef struct {
	Name        string                     `json:"name"`
	Caption     string                     `json:"caption"`
	Extends     string                     `json:"extends"`
	Category    string                     `json:"category"`
	UID         *int                       `json:"uid"`
	Attributes  map[string]json.RawMessage `json:"attributes"`
	Constraints *struct {
		AtLeastOne []string `json:"at_least_one"`
		JustOne    []string `json:"just_one"`
	} `json:"constraints"`
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func enumCaptions(raw map[string]json.RawMessage) map[string]string {
	if raw == nil {
		return nil
	}
	m := map[string]string{}
	for k, v := range raw {
		var e struct {
			Caption string `json:"caption"`
		}
		_ = json.Unmarshal(v, &e)
		m[k] = e.Caption
	}
	return m
}

// overlay applies a definition's (or profile's) own statement about an
// attribute on what it inherited.
func overlay(a *ocsfAttr, r rawAttr, profile string) {
	if r.Type != nil {
		a.Type = *r.Type
	}
	if r.IsArray != nil {
		a.IsArray = *r.IsArray
	}
	if r.Requirement != nil {
		a.Requirement = *r.Requirement
	}
	if r.Sibling != nil {
		a.Sibling = *r.Sibling
	}
	if r.Enum != nil {
		if a.Enum == nil {
			a.Enum = map[string]string{}
		}
		for k, v := range enumCaptions(r.Enum) {
			a.Enum[k] = v
		}
	}
	a.Profile = profile
	if len(r.Profile) > 0 {
		var p *string
		_ = json.Unmarshal(r.Profile, &p)
		a.Profile = ""
		if p != nil {
			a.Profile = *p
		}
	}
	if len(r.Deprecated) > 0 {
		a.Deprecated = true
	}
}

// Load reads the schema files in dir (dictionary.json, categories.json,
// events/, objects/, profiles/) and compiles every class there.
func Load(dir string) (*Schema, error) {
	s := &Schema{dir: dir, dict: map[string]*ocsfAttr{}, types: map[string]ocsfBaseType{},
		files: map[string]map[string]string{}, cache: map[string]*ocsfDef{}, classes: map[int]*ocsfDef{}}
	var dict struct {
		Attributes map[string]rawAttr `json:"attributes"`
		Types      struct {
			Attributes map[string]ocsfBaseType `json:"attributes"`
		} `json:"types"`
	}
	if err := readJSON(filepath.Join(dir, "dictionary.json"), &dict); err != nil {
		return nil, err
	}
	for k, r := range dict.Attributes {
		a := &ocsfAttr{}
		overlay(a, r, "")
		s.dict[k] = a
	}
	s.types = dict.Types.Attributes
	var cats struct {
		Attributes map[string]struct {
			UID     int
			Caption string
		} `json:"attributes"`
	}
	if err := readJSON(filepath.Join(dir, "categories.json"), &cats); err != nil {
		return nil, err
	}
	s.categories = cats.Attributes
	for _, kind := range []string{"events", "objects"} {
		s.files[kind] = map[string]string{}
		err := filepath.WalkDir(filepath.Join(dir, kind), func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			var d rawDef
			if err := readJSON(p, &d); err != nil {
				return err
			}
			s.files[kind][d.Name] = p
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for name := range s.files["events"] {
		d, err := s.def("events", name)
		if err != nil {
			return nil, err
		}
		if d.IsClass {
			s.classes[d.ClassUID] = d
		}
	}
	return s, nil
}

// def compiles the class or object name.
func (s *Schema) def(kind, name string) (*ocsfDef, error) {
	key := kind + "/" + name
	if d, ok := s.cache[key]; ok {
		return d, nil
	}
	file, ok := s.files[kind][name]
	if !ok {
		return nil, fmt.Errorf("%s %q is not in the pinned schema", kind, name)
	}
	var r rawDef
	if err := readJSON(file, &r); err != nil {
		return nil, err
	}
	d := &ocsfDef{Name: name, Caption: r.Caption, Category: r.Category, Attrs: map[string]*ocsfAttr{}, Generic: kind == "objects" && name == "object"}
	if r.Extends != "" {
		p, err := s.def(kind, r.Extends)
		if err != nil {
			return nil, fmt.Errorf("%s extends: %w", file, err)
		}
		for k, a := range p.Attrs {
			c := *a
			if a.Enum != nil {
				c.Enum = map[string]string{}
				for id, cap := range a.Enum {
					c.Enum[id] = cap
				}
			}
			d.Attrs[k] = &c
		}
		d.AtLeastOne, d.JustOne = p.AtLeastOne, p.JustOne
		if d.Category == "" {
			d.Category = p.Category
		}
	}
	get := func(k string) *ocsfAttr {
		if d.Attrs[k] == nil {
			d.Attrs[k] = &ocsfAttr{}
		}
		return d.Attrs[k]
	}
	if inc, ok := r.Attributes["$include"]; ok {
		var paths []string
		if err := json.Unmarshal(inc, &paths); err != nil {
			return nil, fmt.Errorf("%s: $include: %w", file, err)
		}
		for _, p := range paths {
			var prof struct {
				Name       string             `json:"name"`
				Attributes map[string]rawAttr `json:"attributes"`
			}
			if err := readJSON(filepath.Join(s.dir, p), &prof); err != nil {
				return nil, err
			}
			pname := ""
			if strings.HasPrefix(p, "profiles/") {
				pname = prof.Name
			}
			for k, a := range prof.Attributes {
				overlay(get(k), a, pname)
			}
		}
	}
	for k, raw := range r.Attributes {
		if k == "$include" {
			continue
		}
		var a rawAttr
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, k, err)
		}
		// Restating a profile's attribute keeps it the profile's unless
		// the definition says "profile": null (as system does for actor).
		overlay(get(k), a, get(k).Profile)
	}
	if r.Constraints != nil {
		d.AtLeastOne, d.JustOne = nil, nil
		if len(r.Constraints.AtLeastOne) > 0 {
			d.AtLeastOne = [][]string{r.Constraints.AtLeastOne}
		}
		if len(r.Constraints.JustOne) > 0 {
			d.JustOne = [][]string{r.Constraints.JustOne}
		}
	}
	// The dictionary gives what the definition leaves out.
	for k, a := range d.Attrs {
		da, ok := s.dict[k]
		if !ok {
			return nil, fmt.Errorf("%s: attribute %s is not in the dictionary", file, k)
		}
		if a.Type == "" {
			a.Type = da.Type
		}
		if !a.IsArray {
			a.IsArray = da.IsArray
		}
		if a.Sibling == "" {
			a.Sibling = da.Sibling
		}
		a.Deprecated = a.Deprecated || da.Deprecated
		if da.Enum != nil {
			m := map[string]string{}
			for id, c := range da.Enum {
				m[id] = c
			}
			for id, c := range a.Enum {
				m[id] = c
			}
			a.Enum = m
		}
	}
	if kind == "events" && r.UID != nil {
		cat, ok := s.categories[d.Category]
		if !ok {
			return nil, fmt.Errorf("%s: category %q is not in categories.json", file, d.Category)
		}
		d.IsClass, d.UID, d.CategoryUID = true, *r.UID, cat.UID
		d.ClassUID = cat.UID*1000 + *r.UID
		// As the server does: a class's class_uid, category_uid and
		// type_uid take the values of that class only.
		d.Attrs["class_uid"].Enum = map[string]string{strconv.Itoa(d.ClassUID): d.Caption}
		d.Attrs["category_uid"].Enum = map[string]string{strconv.Itoa(cat.UID): cat.Caption}
		types := map[string]string{}
		for id, c := range d.Attrs["activity_id"].Enum {
			n, _ := strconv.Atoi(id)
			types[strconv.Itoa(d.ClassUID*100+n)] = d.Caption + ": " + c
		}
		d.Attrs["type_uid"].Enum = types
	}
	s.cache[key] = d
	return d, nil
}

// Validate returns what is wrong with one OCSF event; nil when nothing.
func (s *Schema) Validate(event []byte) []string {
	var ev map[string]any
	dec := json.NewDecoder(bytes.NewReader(event))
	dec.UseNumber()
	if err := dec.Decode(&ev); err != nil {
		return []string{"not a JSON object: " + err.Error()}
	}
	if dec.More() {
		return []string{"more than one JSON value"}
	}
	num := func(k string) (int64, bool) {
		n, ok := ev[k].(json.Number)
		if !ok {
			return 0, false
		}
		v, err := n.Int64()
		return v, err == nil
	}
	classUID, ok := num("class_uid")
	if !ok {
		return []string{"class_uid: missing or not an integer"}
	}
	c, ok := s.classes[int(classUID)]
	if !ok {
		return []string{fmt.Sprintf("class_uid %d: no such class in the pinned schema", classUID)}
	}
	profiles := map[string]bool{}
	if m, ok := ev["metadata"].(map[string]any); ok {
		if ps, ok := m["profiles"].([]any); ok {
			for _, p := range ps {
				if p, ok := p.(string); ok {
					profiles[p] = true
				}
			}
		}
	}
	var errs []string
	s.checkObject(&errs, "", ev, c, profiles)
	if cat, ok := num("category_uid"); ok && cat != int64(c.CategoryUID) {
		errs = append(errs, fmt.Sprintf("category_uid %d: class %d is in category %d", cat, c.ClassUID, c.CategoryUID))
	}
	act, _ := num("activity_id")
	if tu, ok := num("type_uid"); ok && tu != classUID*100+act {
		errs = append(errs, fmt.Sprintf("type_uid %d is not class_uid*100+activity_id = %d", tu, classUID*100+act))
	}
	return errs
}

func (s *Schema) checkObject(errs *[]string, at string, m map[string]any, d *ocsfDef, profiles map[string]bool) {
	if d.Generic {
		return
	}
	bad := func(k, f string, a ...any) {
		*errs = append(*errs, at+k+": "+fmt.Sprintf(f, a...))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a, ok := d.Attrs[k]
		if !ok {
			bad(k, "not an attribute of %s", d.Name)
			continue
		}
		if a.Profile != "" && !profiles[a.Profile] {
			bad(k, "belongs to profile %s, which metadata.profiles does not name", a.Profile)
		}
		if a.Deprecated {
			bad(k, "deprecated in this schema version")
		}
		s.checkValue(errs, at+k, m[k], a, profiles)
		if a.Sibling != "" && a.Enum != nil {
			if sib, ok := m[a.Sibling]; ok {
				id := fmt.Sprint(m[k])
				if id == "99" {
					if s, _ := sib.(string); s == "" {
						bad(a.Sibling, "must name the source's own value when %s is 99 (Other)", k)
					}
				} else if cap, ok := a.Enum[id]; ok && sib != cap {
					bad(a.Sibling, "%q does not match %s %s, which is %q", sib, k, id, cap)
				}
			}
		}
	}
	for _, k := range sortedKeys(d.Attrs) {
		a := d.Attrs[k]
		if _, ok := m[k]; !ok && a.Requirement == "required" && (a.Profile == "" || profiles[a.Profile]) {
			bad(k, "required by %s, missing", d.Name)
		}
	}
	for _, set := range d.AtLeastOne {
		if present(m, set) == 0 {
			*errs = append(*errs, fmt.Sprintf("%s%s needs at least one of %v", at, d.Name, set))
		}
	}
	for _, set := range d.JustOne {
		if present(m, set) != 1 {
			*errs = append(*errs, fmt.Sprintf("%s%s needs exactly one of %v", at, d.Name, set))
		}
	}
}

func present(m map[string]any, keys []string) int {
	n := 0
	for _, k := range keys {
		if _, ok := m[k]; ok {
			n++
		}
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (s *Schema) checkValue(errs *[]string, at string, v any, a *ocsfAttr, profiles map[string]bool) {
	if a.IsArray {
		l, ok := v.([]any)
		if !ok {
			*errs = append(*errs, fmt.Sprintf("%s: %T, want an array of %s", at, v, a.Type))
			return
		}
		for i, e := range l {
			s.checkScalar(errs, fmt.Sprintf("%s[%d]", at, i), e, a, profiles)
		}
		return
	}
	s.checkScalar(errs, at, v, a, profiles)
}

func (s *Schema) checkScalar(errs *[]string, at string, v any, a *ocsfAttr, profiles map[string]bool) {
	bad := func(f string, x ...any) { *errs = append(*errs, at+": "+fmt.Sprintf(f, x...)) }
	if _, ok := s.files["objects"][a.Type]; ok {
		m, ok := v.(map[string]any)
		if !ok {
			bad("%T, want object %s", v, a.Type)
			return
		}
		d, err := s.def("objects", a.Type)
		if err != nil {
			bad("%v", err)
			return
		}
		s.checkObject(errs, at+".", m, d, profiles)
		return
	}
	// Walk the type to its base type, collecting regexes and ranges.
	t := a.Type
	var res []string
	var rng []float64
	for i := 0; i < 8; i++ {
		bt, ok := s.types[t]
		if !ok {
			bad("type %q is not in the dictionary", t)
			return
		}
		if bt.Regex != "" {
			res = append(res, bt.Regex)
		}
		if rng == nil && bt.Range != nil {
			rng = bt.Range
		}
		if bt.Type == "" {
			break
		}
		t = bt.Type
	}
	switch t {
	case "string_t":
		str, ok := v.(string)
		if !ok {
			bad("%T, want a string (%s)", v, a.Type)
			return
		}
		for _, re := range res {
			if !regexp.MustCompile("^(?:" + re + ")$").MatchString(str) {
				bad("%q does not match %s's pattern %s", str, a.Type, re)
			}
		}
	case "integer_t", "long_t":
		n, ok := v.(json.Number)
		i, err := n.Int64()
		if !ok || err != nil {
			bad("%v, want an integer (%s)", v, a.Type)
			return
		}
		if t == "integer_t" && (i < math.MinInt32 || i > math.MaxInt32) {
			bad("%d is out of a 32-bit integer's range", i)
		}
		if rng != nil && (float64(i) < rng[0] || float64(i) > rng[1]) {
			bad("%d is out of range %v", i, rng)
		}
	case "float_t":
		if _, ok := v.(json.Number); !ok {
			bad("%T, want a number", v)
		}
	case "boolean_t":
		if _, ok := v.(bool); !ok {
			bad("%T, want a boolean", v)
		}
	case "json_t":
	default:
		bad("base type %q unknown to this validator", t)
	}
	if a.Enum != nil {
		if _, ok := a.Enum[fmt.Sprint(v)]; !ok {
			bad("%v is not a value of its enum (%s)", v, strings.Join(sortedKeys(a.Enum), ", "))
		}
	}
}

// Dir is the pinned copy of the schema, found from this file's place.
func Dir() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "schema")
}

var (
	pinnedOnce sync.Once
	pinned     *Schema
	pinnedErr  error
)

// Pinned is the schema in Dir, loaded once.
func Pinned() (*Schema, error) {
	pinnedOnce.Do(func() { pinned, pinnedErr = Load(Dir()) })
	return pinned, pinnedErr
}
